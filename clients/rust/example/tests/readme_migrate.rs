use sqlx::PgPool;

#[pgfork::test]
async fn creates_a_user(pool: PgPool) {
    sqlx::query("INSERT INTO users (name) VALUES ($1)")
        .bind("ada")
        .execute(&pool)
        .await
        .unwrap();
    let n: i64 = sqlx::query_scalar("SELECT count(*) FROM users")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(n, 1);
}
