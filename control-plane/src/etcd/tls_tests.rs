//! The etcd store over TLS against a real etcd started with `--cert-file`, `--key-file`,
//! `--trusted-ca-file` (and `--client-cert-auth`): the store's core behaviour (writes,
//! refusals, a read through another process, subscribers, one leader) with a client
//! certificate, and each TLS mistake an operator can make refused with the endpoint and the
//! cause named. Skipped, with `SKIPPED` printed, only where no `etcd` binary is installed.

use std::time::Duration;

use super::test_server::EtcdServer;
use super::{EtcdConfig, EtcdStore, EtcdTls};
use crate::consensus::{Consensus, ConsensusError, Leadership};
use crate::state::{Command, ModelSpec};

/// Upper bound on one wait (an election, a watch delivering a write).
const WAIT: Duration = Duration::from_secs(20);

fn config(endpoint: String, tls: EtcdTls) -> EtcdConfig {
    EtcdConfig {
        endpoints: vec![endpoint],
        prefix: "/tls".to_string(),
        user: None,
        lease_ttl: Duration::from_secs(1),
        tls: Some(tls),
    }
}

fn upsert(name: &str) -> Command {
    Command::UpsertModel(ModelSpec {
        available_versions: vec![1],
        ..crate::testing::model(name)
    })
}

/// Starting a store with `config` fails; returns the message.
async fn refused(config: EtcdConfig) -> String {
    let started = tokio::time::timeout(WAIT, EtcdStore::start(1, "cp-1:7000".into(), config))
        .await
        .expect("start answers within the bound");
    match started {
        Ok(store) => {
            store.shutdown().await;
            panic!("the etcd store started")
        }
        Err(ConsensusError::Unavailable(message)) => message,
        Err(e) => panic!("not Unavailable: {e:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_works_over_tls_with_a_client_certificate() {
    let Some(server) = EtcdServer::start_tls(true).await else {
        return;
    };
    let config = config(server.endpoint(), server.tls("ca", Some("ca")));
    let mut stores = Vec::new();
    for id in 1..=2 {
        let store = EtcdStore::start(id, format!("cp-{id}:7000"), config.clone())
            .await
            .expect("start the etcd store over TLS");
        stores.push(store);
    }
    let mut leaderships: Vec<_> = stores.iter().map(|s| s.leadership()).collect();
    tokio::time::timeout(WAIT, async {
        loop {
            let seen: Vec<Leadership> = leaderships
                .iter_mut()
                .map(|rx| *rx.borrow_and_update())
                .collect();
            if seen[0].leader_id.is_some()
                && seen.iter().all(|l| l.leader_id == seen[0].leader_id)
                && seen.iter().filter(|l| l.is_self).count() == 1
            {
                return;
            }
            let changes = leaderships.iter_mut().map(|rx| Box::pin(rx.changed()));
            let _ = futures::future::select_all(changes).await;
        }
    })
    .await
    .expect("one leader both processes agree on");

    let mut rx = stores[1].subscribe();
    let written = stores[0].write(upsert("a")).await.expect("write over TLS");
    assert!(written.changed);
    let err = stores[1]
        .write(Command::DeleteModel {
            name: "missing".into(),
        })
        .await
        .expect_err("deleting a missing model is refused");
    assert!(matches!(err, ConsensusError::Rejected(_)), "{err:?}");
    let read = stores[1].linearizable_state().await.expect("read over TLS");
    assert_eq!(read.revision(), written.revision);
    assert!(read.model("a").is_some());
    let seen = tokio::time::timeout(WAIT, rx.wait_for(|s| s.model("a").is_some()))
        .await
        .expect("the subscriber sees the write within the bound")
        .expect("state channel open");
    assert!(seen.revision() >= written.revision);
    for store in &stores {
        store.shutdown().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_ca_is_refused_naming_the_endpoint_and_the_cause() {
    let Some(server) = EtcdServer::start_tls(false).await else {
        return;
    };
    let message = refused(config(server.endpoint(), server.tls("other", None))).await;
    assert!(message.contains(&server.endpoint()), "{message}");
    // Both test CAs are called "Nereid CA": rustls finds the issuer by name, then the
    // signature fails (UnknownIssuer for a CA of another name).
    assert!(
        message.contains("BadSignature") || message.contains("UnknownIssuer"),
        "{message}"
    );
    assert!(
        message.contains("not signed by a CA in --etcd-ca"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_name_mismatch_is_refused_naming_the_cause() {
    let Some(server) = EtcdServer::start_tls(false).await else {
        return;
    };
    // etcd's certificate names IP:127.0.0.1 only; "localhost" is not in it.
    let endpoint = server.endpoint().replace("127.0.0.1", "localhost");
    let message = refused(config(endpoint.clone(), server.tls("ca", None))).await;
    assert!(message.contains(&endpoint), "{message}");
    assert!(message.contains("NotValidForName"), "{message}");
    assert!(
        message.contains("does not name the endpoint's host"),
        "{message}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_etcd_does_not_trust_are_refused_clearly() {
    let Some(server) = EtcdServer::start_tls(true).await else {
        return;
    };
    for client in [None, Some("other")] {
        let message = refused(config(server.endpoint(), server.tls("ca", client))).await;
        assert!(
            message.contains(&server.endpoint()),
            "{client:?}: {message}"
        );
        assert!(
            message.contains("etcd refused the client certificate"),
            "{client:?}: {message}"
        );
    }
}
