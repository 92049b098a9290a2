//! The catalog's schema migrations, embedded in the binary, one list per database.
//!
//! Written by hand instead of `sqlx::migrate!`: the macro needs sqlx's `macros` feature, which
//! compiles sqlx's database drivers (and tokio, rustls, ...) a second time for the build host,
//! minutes of every cold build. What this builds is what the macro builds: version and
//! description from the file name (`0002_node_keys.sql` is version 2, "node keys"), the SQL
//! as written (its SHA-384 is the checksum sqlx records), no transaction when the file starts
//! with `-- no-transaction`. A test checks that each list names every file of its directory.

use sqlx::error::BoxDynError;
use sqlx::migrate::{MigrateError, Migration, MigrationSource, MigrationType, Migrator};
use std::borrow::Cow;
use std::future::Future;
use std::pin::Pin;

/// What `MigrationSource::resolve` returns (futures' `BoxFuture`, written out).
type Resolved = Pin<Box<dyn Future<Output = Result<Vec<Migration>, BoxDynError>> + Send>>;

/// Migration files of one directory: (file name, contents).
type Files = &'static [(&'static str, &'static str)];

macro_rules! embed {
    ($dir:literal: $($file:literal),+ $(,)?) => {
        &[$(($file, include_str!(concat!("../migrations/", $dir, "/", $file)))),+]
    };
}

pub(crate) const SQLITE: Files = embed!("sqlite":
    "0001_initial.sql",
    "0002_node_keys_and_pending_age.sql",
    "0003_node_certificates.sql",
    "0004_writing_leases.sql",
    "0005_file_privacy.sql",
    "0006_node_drain.sql",
    "0007_transfer_history.sql",
    "0008_transfer_trace.sql",
    "0009_jobs.sql",
    "0010_job_credentials.sql",
);

pub(crate) const POSTGRES: Files = embed!("postgres":
    "0001_initial.sql",
    "0002_node_keys_and_pending_age.sql",
    "0003_node_certificates.sql",
    "0004_writing_leases.sql",
    "0005_file_privacy.sql",
    "0006_node_drain.sql",
    "0007_transfer_history.sql",
    "0008_transfer_trace.sql",
    "0009_jobs.sql",
    "0010_job_credentials.sql",
);

/// The migrator for one database's files.
pub(crate) async fn migrator(files: Files) -> Result<Migrator, MigrateError> {
    Migrator::new(Embedded(files)).await
}

#[derive(Debug)]
struct Embedded(Files);

impl MigrationSource<'static> for Embedded {
    fn resolve(self) -> Resolved {
        Box::pin(async move {
            self.0
                .iter()
                .map(|&(file, sql)| migration(file, sql))
                .collect()
        })
    }
}

fn migration(file: &str, sql: &'static str) -> Result<Migration, BoxDynError> {
    let (version, rest) = file
        .split_once('_')
        .ok_or_else(|| format!("migration {file}: the name must be VERSION_DESCRIPTION.sql"))?;
    let version = version
        .parse()
        .map_err(|e| format!("migration {file}: version {version:?}: {e}"))?;
    let description = rest.trim_end_matches(".sql").replace('_', " ");
    Ok(Migration::new(
        version,
        Cow::Owned(description),
        MigrationType::Simple,
        Cow::Borrowed(sql),
        sql.starts_with("-- no-transaction"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn on_disk(dir: &str) -> Vec<String> {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("migrations")
            .join(dir);
        let mut names: Vec<String> = std::fs::read_dir(path)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        names.sort();
        names
    }

    #[test]
    fn every_migration_file_is_embedded_in_order() {
        for (dir, files) in [("sqlite", SQLITE), ("postgres", POSTGRES)] {
            let embedded: Vec<String> = files.iter().map(|(f, _)| f.to_string()).collect();
            assert_eq!(
                embedded,
                on_disk(dir),
                "{dir}: add the new file to the list"
            );
        }
    }

    #[tokio::test]
    async fn versions_and_descriptions_follow_the_file_names() {
        let m = migrator(SQLITE).await.unwrap();
        let got: Vec<(i64, &str)> = m.iter().map(|m| (m.version, &*m.description)).collect();
        assert_eq!(got[0], (1, "initial"));
        assert_eq!(got[1], (2, "node keys and pending age"));
        assert_eq!(got.len(), SQLITE.len());
        assert!(got.windows(2).all(|w| w[0].0 < w[1].0));
        assert!(migration("initial.sql", "").is_err());
        assert!(migration("x1_a.sql", "").is_err());
    }
}
