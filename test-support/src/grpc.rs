//! A tonic server for tests: gRPC routes on a free loopback port.

use std::net::SocketAddr;

/// Serves `routes` on 127.0.0.1 at a free port until the test's runtime ends; returns the
/// address.
pub async fn serve_routes(routes: tonic::service::Routes) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind a loopback port");
    let addr = listener
        .local_addr()
        .expect("a bound listener has an address");
    tokio::spawn(async move {
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        tonic::transport::Server::builder()
            .add_routes(routes)
            .serve_with_incoming(incoming)
            .await
            .expect("the test's gRPC server runs");
    });
    addr
}
