//! Sluice in one screen: two policies on the in-memory store.
//!
//! `cargo run --example quickstart`

use sluice::{LimitSpec, Limiter, MemoryStore, Op, Policy};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    // 5 per second and 20 per minute, checked together: all or nothing.
    let api = Policy::from_specs(
        "api",
        vec![
            LimitSpec::fixed_window(5, 1_000),
            LimitSpec::fixed_window(20, 60_000),
        ],
    )?;
    // Uploads: a token bucket of 3 that refills at 2 per 2 seconds (one a second).
    let uploads = Policy::from_specs("uploads", vec![LimitSpec::token_bucket(2, 2_000).burst(3)])?;
    let limiter = Limiter::new(MemoryStore::new()).with_policies([api, uploads]);

    println!("policy  key      cost  allowed  remaining  reset_ms       retry_after_ms");
    for i in 0..7 {
        let d = limiter.check("api", "user:42", 1).await?;
        println!(
            "api     user:42  1     {:<7}  {:<9}  {}  {:?}   (check {i})",
            d.allowed,
            d.remaining(),
            d.reset_ms(),
            d.retry_after_ms()
        );
    }
    // A hot path keeps the policy's handle and says what it asks as an `Op`.
    let uploads = limiter
        .policy("uploads")
        .ok_or("no policy uploads")?
        .clone();
    for cost in [2, 1, 1, 3] {
        let d = limiter
            .call(&uploads, "user:42", Op::Check { cost })
            .await?;
        println!(
            "uploads user:42  {cost}     {:<7}  {:<9}  {}  {:?}",
            d.allowed,
            d.remaining(),
            d.reset_ms(),
            d.retry_after_ms()
        );
    }
    // Giving back: a refund makes room again.
    let d = limiter
        .call(&uploads, "user:42", Op::Refund { cost: 1 })
        .await?;
    println!("refund 1 -> uploads remaining {}", d.remaining());
    Ok(())
}
