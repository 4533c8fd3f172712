use sqlx::migrate::Migrator;
use sqlx::{Connection, PgConnection};

static MIGRATOR: Migrator = sqlx::migrate!();

#[pgfork::test(migrator = "MIGRATOR")]
async fn in_a_transaction(mut conn: PgConnection) -> sqlx::Result<()> {
    let mut tx = conn.begin().await?;
    sqlx::query("INSERT INTO users (name) VALUES ('linus')")
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM users")
        .fetch_one(&mut conn)
        .await?;
    assert_eq!(n, 1);
    Ok(())
}
