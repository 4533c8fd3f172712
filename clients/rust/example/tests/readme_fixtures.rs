use sqlx::PgPool;

#[pgfork::test(fixtures("users"))]
async fn sees_the_fixture(pool: PgPool) {
    let names: Vec<String> = sqlx::query_scalar("SELECT name FROM users ORDER BY name")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(names, ["ada", "grace"]);
}
