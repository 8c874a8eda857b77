use super::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixListener;

/// A stand-in for one QEMU process's port socket: accepts one connection at `dir/name`.
fn serve(dir: &Path, name: &str) -> UnixListener {
    let path = dir.join(name);
    let _ = std::fs::remove_file(&path);
    UnixListener::bind(&path).unwrap()
}

async fn read_exact(s: &mut (impl AsyncReadExt + Unpin), n: usize) -> Vec<u8> {
    let mut buf = vec![0u8; n];
    tokio::time::timeout(Duration::from_secs(5), s.read_exact(&mut buf))
        .await
        .expect("bytes in time")
        .unwrap();
    buf
}

#[tokio::test]
async fn a_stream_survives_a_change_of_vmm_without_losing_or_repeating_bytes() {
    let tmp = tempfile::tempdir().unwrap();
    let splice = Splice::new(tmp.path());
    let first = serve(tmp.path(), "ctl.sock");
    let mut client = splice.connect("ctl.sock").await.unwrap();
    let (mut old, _) = first.accept().await.unwrap();
    assert_eq!(splice.streams(), 1);

    client.write_all(b"to-old ").await.unwrap();
    assert_eq!(read_exact(&mut old, 7).await, b"to-old ");
    old.write_all(b"from-old ").await.unwrap();
    assert_eq!(read_exact(&mut client, 9).await, b"from-old ");

    // Held: what the client writes now waits for the next VMM.
    splice.hold().await.unwrap();
    client.write_all(b"held ").await.unwrap();
    // The old VMM writes its last bytes and ends.
    old.write_all(b"last-of-old ").await.unwrap();
    drop(old);
    drop(first);
    // A new connection is refused while held.
    assert!(splice.connect("ctl.sock").await.is_err());

    let second = serve(tmp.path(), "ctl.sock");
    splice.switch().await.unwrap();
    let (mut new, _) = second.accept().await.unwrap();
    assert_eq!(read_exact(&mut client, 12).await, b"last-of-old ");
    splice.release();
    assert_eq!(read_exact(&mut new, 5).await, b"held ");
    client.write_all(b"after").await.unwrap();
    assert_eq!(read_exact(&mut new, 5).await, b"after");
    new.write_all(b"from-new").await.unwrap();
    assert_eq!(read_exact(&mut client, 8).await, b"from-new");

    // The client closing closes the VMM's side.
    drop(client);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), new.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
}

#[tokio::test]
async fn hold_waits_until_the_vmm_took_the_bytes_and_gives_up_when_it_does_not() {
    let tmp = tempfile::tempdir().unwrap();
    let splice = Splice::new(tmp.path());
    let listener = serve(tmp.path(), "egress.sock");
    let mut client = splice.connect("egress.sock").await.unwrap();
    let (mut vmm, _) = listener.accept().await.unwrap();
    // More than the socket pair and the VMM's socket hold, so some is still unread when the
    // hold starts; the VMM reads it slowly.
    let big = vec![7u8; 4 << 20];
    let writer = tokio::spawn(async move {
        client.write_all(&big).await.unwrap();
        client
    });
    tokio::time::sleep(Duration::from_millis(50)).await;
    let reader = tokio::spawn(async move {
        let mut got = 0usize;
        let mut buf = vec![0u8; 64 * 1024];
        while got < (4 << 20) {
            let n = vmm.read(&mut buf).await.unwrap();
            assert!(n > 0);
            got += n;
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        vmm
    });
    // The hold returns once nothing written to the VMM is unread (the rest waits with the
    // client's socket pair).
    splice.hold().await.unwrap();
    splice.release();
    let mut client = writer.await.unwrap();
    let mut vmm = reader.await.unwrap();

    // A VMM that reads nothing: the hold gives up, and the stream flows again.
    let feed = tokio::spawn(async move {
        client.write_all(&vec![2u8; 5 << 20]).await.unwrap();
        client
    });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let err = splice.hold().await.unwrap_err();
    assert!(err.to_string().contains("waiting for the VM"), "{err}");
    // Released: reading now drains everything.
    let mut buf = vec![0u8; 1 << 20];
    let mut got = 0usize;
    while got < (5 << 20) {
        let n = tokio::time::timeout(Duration::from_secs(5), vmm.read(&mut buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0);
        got += n;
    }
    feed.await.unwrap();
}

#[tokio::test]
async fn a_vmm_that_ends_while_not_held_ends_the_stream() {
    let tmp = tempfile::tempdir().unwrap();
    let splice = Splice::new(tmp.path());
    let listener = serve(tmp.path(), "ctl.sock");
    let mut client = splice.connect("ctl.sock").await.unwrap();
    let (vmm, _) = listener.accept().await.unwrap();
    drop(vmm);
    let mut rest = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest))
        .await
        .unwrap()
        .unwrap();
    assert!(rest.is_empty());
    // An ended stream takes no part in a hold or switch.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(splice.streams(), 0);
    splice.hold().await.unwrap();
    splice.switch().await.unwrap();
    splice.release();
}
