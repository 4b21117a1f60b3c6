//! A small HTTP server helper shared by the Git server, the GitHub fake and
//! the demo's copy of that fake.

/// Serves `app` on a loopback port from a thread and runtime of its own, so
/// that tests may block (running the git CLI, say) without starving it.
pub fn serve_on_own_thread(app: axum::Router, what: &'static str) -> std::net::SocketAddr {
    let (sender, receiver) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("a runtime for the {what}: {e}"));
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
                .await
                .expect("bind loopback");
            sender
                .send(listener.local_addr().expect("bound address"))
                .expect("address sent");
            let _ = axum::serve(listener, app).await;
        });
    });
    receiver
        .recv()
        .unwrap_or_else(|e| panic!("the {what} did not start: {e}"))
}
