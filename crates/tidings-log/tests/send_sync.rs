//! Public types are `Send + Sync` where promised (the log is shared across threads via `Arc`).

use tidings_log::testing::SimStorage;
use tidings_log::*;

fn assert_send_sync<T: Send + Sync>() {}
fn assert_send<T: Send>() {}

#[test]
fn public_types_are_send_and_sync() {
    assert_send_sync::<Log>();
    assert_send_sync::<LogConfig>();
    assert_send_sync::<Record>();
    assert_send_sync::<StoredRecord>();
    assert_send_sync::<RecordRef<'static>>();
    assert_send_sync::<LogReader<'static>>();
    assert_send_sync::<RecoveryReport>();
    assert_send_sync::<RetentionReport>();
    assert_send_sync::<FsStorage>();
    assert_send_sync::<SimStorage>();
    assert_send_sync::<std::sync::Arc<dyn Storage>>();
    assert_send::<OpenError>();
    assert_send::<AppendError>();
    assert_send::<ReadError>();
    assert_send_sync::<tools::VerifyReport>();
    assert_send_sync::<tools::Inspection>();
}
