//! The HTTP gate's anchor in `scripts/gate_bench.py`: the least a Rust
//! reverse proxy on the crates the gate is built on can do. hyper's
//! HTTP/1 server, hyper-util's pooled client, the same multi-threaded
//! Tokio runtime, and nothing else: no route, no filter, no header
//! rewriting, no smuggling scan, no idle timer. What the gate costs
//! beyond it is the gate's own; what it costs against nginx is mostly
//! this.
//!
//! `cargo run --release -p bloomgate-service --example bare_proxy -- 127.0.0.1:18108 http://127.0.0.1:18101`

use std::convert::Infallible;

use hyper::body::Incoming;
use hyper::{Request, Response};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:18108".into());
    let upstream = args
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:18101".into());
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: Client<HttpConnector, Incoming> =
        Client::builder(TokioExecutor::new()).build(connector);
    let listener = tokio::net::TcpListener::bind(&listen).await?;
    loop {
        let (stream, _) = listener.accept().await?;
        let _ = stream.set_nodelay(true);
        let (client, upstream) = (client.clone(), upstream.clone());
        tokio::spawn(async move {
            let svc = hyper::service::service_fn(move |mut req: Request<Incoming>| {
                let (client, upstream) = (client.clone(), upstream.clone());
                async move {
                    let target = req.uri().path_and_query().map_or("/", |p| p.as_str());
                    *req.uri_mut() = format!("{upstream}{target}").parse().unwrap();
                    let resp: Response<Incoming> = match client.request(req).await {
                        Ok(r) => r,
                        Err(_) => {
                            let mut r = Response::new(http_body_util::Empty::new());
                            *r.status_mut() = hyper::StatusCode::BAD_GATEWAY;
                            return Ok::<_, Infallible>(r.map(http_body_util::Either::Left));
                        }
                    };
                    Ok(resp.map(http_body_util::Either::Right))
                }
            });
            let _ = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
