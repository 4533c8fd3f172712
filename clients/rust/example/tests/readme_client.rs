use std::error::Error;
use std::path::Path;

use pgfork::{Client, ensure_template, template_hash};
use sqlx::{Connection, PgConnection};

type BoxError = Box<dyn Error + Send + Sync>;

async fn run_sql_files(url: String, dir: &Path) -> Result<(), BoxError> {
    let mut files: Vec<_> = std::fs::read_dir(dir)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()?;
    files.sort();
    let mut conn = PgConnection::connect(&url).await?;
    for file in files {
        sqlx::raw_sql(&std::fs::read_to_string(&file)?)
            .execute(&mut conn)
            .await?;
    }
    conn.close().await?;
    Ok(())
}

#[tokio::test]
async fn plain_client() -> Result<(), BoxError> {
    // $PGFORK_URL (or $INTEGRESQL_CLIENT_BASE_URL) and $PGFORK_TOKEN.
    let client = Client::from_env()?;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    let hash = template_hash(Some(&dir), "sql files in name order")?;
    let template = ensure_template(&client, &hash, |tpl| run_sql_files(tpl.url(), &dir)).await?;

    let db = template.database().await?;
    let mut conn = PgConnection::connect(&db.url()).await?;
    sqlx::query("INSERT INTO users (name) VALUES ('barbara')")
        .execute(&mut conn)
        .await?;
    conn.close().await?;
    db.recreate().await?; // dropped without this, the database is kept and its URL printed
    Ok(())
}
