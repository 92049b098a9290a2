//! The conformance suite against every backend: SQLite in memory and on disk, and PostgreSQL
//! when `HAUL_TEST_POSTGRES_URL` names a database (scripts/test.sh starts one).

use catalog::Catalog;

#[tokio::test]
async fn sqlite_in_memory() {
    let c = Catalog::open("sqlite::memory:").await.unwrap();
    catalog::conformance::run(&c).await;
}

#[tokio::test]
async fn sqlite_on_disk_and_reopened() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("meta.db").display());
    let c = Catalog::open(&url).await.unwrap();
    // It holds node keys: private to its owner (issue 11 C4).
    use std::os::unix::fs::PermissionsExt;
    for f in ["meta.db", "meta.db-wal"] {
        let mode = std::fs::metadata(dir.path().join(f))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{f}");
    }
    catalog::conformance::run(&c).await;
    let before = c.count_inodes().await.unwrap();
    c.close().await;
    // Nothing committed is lost across a restart.
    let c = Catalog::open(&url).await.unwrap();
    assert_eq!(c.count_inodes().await.unwrap(), before);
    assert_eq!(c.stat("/r/f2").await.unwrap().owner, "carol");
}

#[tokio::test]
async fn postgres() {
    let Ok(url) = std::env::var("HAUL_TEST_POSTGRES_URL") else {
        testkit::skip!(
            "HAUL_TEST_POSTGRES_URL is not set (scripts/test.sh sets it when run as root)"
        );
    };
    // A fresh schema per run: drop what an earlier run left.
    let db = format!("haul_test_{}", std::process::id());
    let admin = sqlx_admin(&url, &format!("CREATE DATABASE {db}")).await;
    assert!(admin, "cannot create test database");
    let test_url = replace_db(&url, &db);
    let c = Catalog::open(&test_url).await.unwrap();
    catalog::conformance::run(&c).await;
    c.close().await;
    sqlx_admin(&url, &format!("DROP DATABASE {db}")).await;
}

async fn sqlx_admin(url: &str, sql: &str) -> bool {
    use sqlx::Connection;
    let Ok(mut conn) = sqlx::PgConnection::connect(url).await else {
        return false;
    };
    sqlx::query(sql).execute(&mut conn).await.is_ok()
}

fn replace_db(url: &str, db: &str) -> String {
    match url.rfind('/') {
        Some(i) if i > url.find("://").map(|s| s + 2).unwrap_or(0) => format!("{}/{db}", &url[..i]),
        _ => format!("{url}/{db}"),
    }
}

/// A catalog that a newer version of the server migrated is refused, naming the migration this
/// version does not know (README "Operating a grid": an older server does not run on it).
#[tokio::test]
async fn a_catalog_migrated_by_a_newer_version_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("sqlite:{}", dir.path().join("meta.db").display());
    let c = Catalog::open(&url).await.unwrap();
    c.close().await;
    {
        use sqlx::Connection;
        let mut conn = sqlx::SqliteConnection::connect(&url).await.unwrap();
        sqlx::query(
            "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
             VALUES (9999, 'from the future', 1, x'00', 0)",
        )
        .execute(&mut conn)
        .await
        .unwrap();
        conn.close().await.unwrap();
    }
    let err = Catalog::open(&url).await.err().expect("refused");
    let text = err.to_string();
    assert!(text.contains("9999"), "{text}");
}
