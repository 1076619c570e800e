//! The PostgreSQL side of the kill loops: the ledger read back and the accounts table.

use std::collections::{BTreeMap, BTreeSet};

use super::{ACCOUNTS, Ledger, TABLE, account_name};

/// The ledger of the database at this connection string.
pub struct PgLedger(pub String);

impl PgLedger {
    fn client(&self) -> postgres::Client {
        postgres::Client::connect(&self.0, postgres::NoTls).expect("connect")
    }
}

impl Ledger for PgLedger {
    fn balances(&self) -> BTreeMap<String, i64> {
        self.client()
            .query("SELECT id, balance FROM accounts", &[])
            .unwrap()
            .iter()
            .map(|r| (r.get(0), r.get(1)))
            .collect()
    }
    fn processed(&self) -> BTreeSet<String> {
        self.client()
            .query(&format!("SELECT message_id FROM {TABLE}"), &[])
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect()
    }
}

/// Creates the accounts table with every account at 0.
pub fn create_accounts(conn: &str) {
    let mut client = postgres::Client::connect(conn, postgres::NoTls).unwrap();
    client
        .batch_execute("CREATE TABLE accounts (id text PRIMARY KEY, balance bigint NOT NULL)")
        .unwrap();
    for i in 0..ACCOUNTS {
        client
            .execute("INSERT INTO accounts VALUES ($1, 0)", &[&account_name(i)])
            .unwrap();
    }
}
