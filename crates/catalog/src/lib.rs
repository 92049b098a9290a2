//! The catalog of a longhaul grid: the namespace (directories and files with owner, group,
//! mode, size, mtime, checksum and extended attributes), the replica catalog (which node holds
//! which file, and in which state) and the node registry. This crate is the only one that knows
//! SQL. One implementation runs on SQLite (WAL, the embedded default) and PostgreSQL (several
//! metadata servers may share one database), with the same queries and numbered migrations per
//! backend; `conformance` is the test suite both must pass.
//!
//! Every mutation is one transaction. Files are created *pending* (invisible: their parent is
//! stored negated) and become visible only at [`Catalog::commit_file`], which the metadata
//! server calls once a replica's checksum has been verified on its node.

pub mod conformance;
mod paths;

pub use paths::{join, normalize, parent_and_name};

use serde::{Deserialize, Serialize};
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};
use std::str::FromStr;
use std::time::Duration;
use thiserror::Error;

/// Id of the root directory.
pub const ROOT: i64 = 1;

/// Why a catalog operation failed.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum CatalogError {
    #[error("{0}: no such file or directory")]
    NotFound(String),
    #[error("{0}: already exists")]
    Exists(String),
    #[error("{0}: not a directory")]
    NotADirectory(String),
    #[error("{0}: is a directory")]
    IsADirectory(String),
    #[error("{0}: directory not empty")]
    NotEmpty(String),
    #[error("{0}: being written by another client")]
    Busy(String),
    #[error("{0}")]
    Invalid(String),
    #[error("database: {0}")]
    Database(String),
}

impl From<sqlx::Error> for CatalogError {
    fn from(e: sqlx::Error) -> Self {
        CatalogError::Database(e.to_string())
    }
}

impl From<sqlx::migrate::MigrateError> for CatalogError {
    fn from(e: sqlx::migrate::MigrateError) -> Self {
        CatalogError::Database(format!("migration failed: {e}"))
    }
}

pub type Result<T> = std::result::Result<T, CatalogError>;

/// Kind of a namespace entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    Dir,
    File,
}

/// A namespace entry.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Inode {
    pub id: i64,
    /// Parent directory id (the real one, also for pending files).
    pub parent: i64,
    pub name: String,
    pub kind: Kind,
    pub owner: String,
    pub group: String,
    pub mode: u32,
    pub size: u64,
    pub mtime_ns: i64,
    /// `algorithm:hex` pairs separated by spaces; empty until committed.
    pub checksum: String,
    /// Being written: not visible in the namespace yet.
    pub pending: bool,
}

/// Owner, group, mode and mtime of a new entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NewEntry {
    pub owner: String,
    pub group: String,
    pub mode: u32,
    pub mtime_ns: i64,
}

/// State of one replica.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReplicaState {
    /// Being written; does not count as a copy.
    Writing,
    /// Verified against the file's checksum on its node.
    Complete,
    /// Failed verification.
    Damaged,
    /// The node does not have it (reported by its inventory).
    Missing,
}

impl ReplicaState {
    fn to_i64(self) -> i64 {
        match self {
            ReplicaState::Writing => 0,
            ReplicaState::Complete => 1,
            ReplicaState::Damaged => 2,
            ReplicaState::Missing => 3,
        }
    }
    fn from_i64(v: i64) -> Self {
        match v {
            1 => ReplicaState::Complete,
            2 => ReplicaState::Damaged,
            3 => ReplicaState::Missing,
            _ => ReplicaState::Writing,
        }
    }
}

/// One physical copy of a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub inode: i64,
    pub node: String,
    pub state: ReplicaState,
    pub checksum: String,
    pub updated_ms: i64,
}

/// A storage node as registered.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Node {
    pub name: String,
    pub site: String,
    pub address: String,
    pub capacity: u64,
    pub free: u64,
    pub load: f64,
    pub heartbeat_ms: i64,
    pub registered_ms: i64,
    pub up: bool,
}

/// Which backend a catalog runs on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// The catalog.
#[derive(Clone)]
pub struct Catalog {
    pool: AnyPool,
    backend: Backend,
}

static MIGRATE_SQLITE: sqlx::migrate::Migrator = sqlx::migrate!("migrations/sqlite");
static MIGRATE_POSTGRES: sqlx::migrate::Migrator = sqlx::migrate!("migrations/postgres");

const INODE_COLS: &str = "id, parent, name, kind, owner, grp, mode, size, mtime_ns, checksum";

fn inode_from(row: &AnyRow) -> Result<Inode> {
    let parent: i64 = row.try_get("parent")?;
    Ok(Inode {
        id: row.try_get("id")?,
        parent: parent.abs(),
        name: row.try_get("name")?,
        kind: if row.try_get::<i64, _>("kind")? == 0 {
            Kind::Dir
        } else {
            Kind::File
        },
        owner: row.try_get("owner")?,
        group: row.try_get("grp")?,
        mode: row.try_get::<i64, _>("mode")? as u32,
        size: row.try_get::<i64, _>("size")? as u64,
        mtime_ns: row.try_get("mtime_ns")?,
        checksum: row.try_get("checksum")?,
        pending: parent < 0,
    })
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

type Tx<'a> = sqlx::Transaction<'a, sqlx::Any>;

impl Catalog {
    /// Opens (creating if needed) a catalog: `sqlite:PATH`, `sqlite::memory:` or
    /// `postgres://user@host/db`, and brings its schema up to date.
    pub async fn open(url: &str) -> Result<Self> {
        sqlx::any::install_default_drivers();
        let backend = if url.starts_with("sqlite:") {
            Backend::Sqlite
        } else if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            Backend::Postgres
        } else {
            return Err(CatalogError::Invalid(format!(
                "unsupported database URL {url:?}: use sqlite:PATH or postgres://user@host/db"
            )));
        };
        let pool = match backend {
            Backend::Sqlite => {
                let memory = url.contains(":memory:");
                let url = if memory || url.contains('?') {
                    url.to_string()
                } else {
                    format!("{url}?mode=rwc")
                };
                let opts = AnyConnectOptions::from_str(&url)
                    .map_err(|e| CatalogError::Invalid(format!("{url}: {e}")))?;
                AnyPoolOptions::new()
                    // A memory database exists once per connection: keep exactly one.
                    .max_connections(if memory { 1 } else { 8 })
                    .min_connections(if memory { 1 } else { 0 })
                    .idle_timeout(None)
                    .max_lifetime(None)
                    .after_connect(|conn, _| {
                        Box::pin(async move {
                            use sqlx::Executor;
                            conn.execute("PRAGMA journal_mode = WAL").await?;
                            conn.execute("PRAGMA synchronous = NORMAL").await?;
                            conn.execute("PRAGMA foreign_keys = ON").await?;
                            conn.execute("PRAGMA busy_timeout = 10000").await?;
                            Ok(())
                        })
                    })
                    .connect_with(opts)
                    .await
            }
            Backend::Postgres => {
                let opts = AnyConnectOptions::from_str(url)
                    .map_err(|e| CatalogError::Invalid(format!("{url}: {e}")))?;
                AnyPoolOptions::new()
                    .max_connections(16)
                    .acquire_timeout(Duration::from_secs(10))
                    .connect_with(opts)
                    .await
            }
        }
        .map_err(|e| CatalogError::Database(format!("cannot open {}: {e}", redact(url))))?;
        match backend {
            Backend::Sqlite => MIGRATE_SQLITE.run(&pool).await?,
            Backend::Postgres => MIGRATE_POSTGRES.run(&pool).await?,
        }
        Ok(Self { pool, backend })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    async fn tx(&self) -> Result<Tx<'static>> {
        Ok(self.pool.begin().await?)
    }

    // ---- namespace -------------------------------------------------------------------

    async fn child(tx: &mut Tx<'_>, parent: i64, name: &str) -> Result<Option<Inode>> {
        let q = format!("SELECT {INODE_COLS} FROM inodes WHERE parent = $1 AND name = $2");
        let row = sqlx::query(&q)
            .bind(parent)
            .bind(name)
            .fetch_optional(&mut **tx)
            .await?;
        row.map(|r| inode_from(&r)).transpose()
    }

    async fn by_id(tx: &mut Tx<'_>, id: i64) -> Result<Option<Inode>> {
        let q = format!("SELECT {INODE_COLS} FROM inodes WHERE id = $1");
        let row = sqlx::query(&q).bind(id).fetch_optional(&mut **tx).await?;
        row.map(|r| inode_from(&r)).transpose()
    }

    /// Resolves a path (no pending files); `Ok(None)` when a component does not exist.
    async fn resolve(tx: &mut Tx<'_>, path: &str) -> Result<Option<Inode>> {
        let norm = normalize(path)?;
        let mut cur = Self::by_id(tx, ROOT)
            .await?
            .ok_or_else(|| CatalogError::Database("root missing".into()))?;
        for part in norm.split('/').filter(|p| !p.is_empty()) {
            if cur.kind != Kind::Dir {
                return Err(CatalogError::NotADirectory(path.to_string()));
            }
            match Self::child(tx, cur.id, part).await? {
                Some(c) => cur = c,
                None => return Ok(None),
            }
        }
        Ok(Some(cur))
    }

    /// The parent directory of `path` and the final name; errors if the parent is missing.
    async fn parent_dir(tx: &mut Tx<'_>, path: &str) -> Result<(Inode, String)> {
        let (parent, name) = parent_and_name(path)?;
        let dir = Self::resolve(tx, &parent)
            .await?
            .ok_or_else(|| CatalogError::NotFound(parent.clone()))?;
        if dir.kind != Kind::Dir {
            return Err(CatalogError::NotADirectory(parent));
        }
        Ok((dir, name))
    }

    /// The entry at `path`, if any.
    pub async fn lookup(&self, path: &str) -> Result<Option<Inode>> {
        let mut tx = self.tx().await?;
        let r = Self::resolve(&mut tx, path).await;
        tx.commit().await?;
        r
    }

    /// The entry at `path`.
    pub async fn stat(&self, path: &str) -> Result<Inode> {
        self.lookup(path)
            .await?
            .ok_or_else(|| CatalogError::NotFound(path.to_string()))
    }

    /// An entry by id (pending files included).
    pub async fn inode(&self, id: i64) -> Result<Inode> {
        let mut tx = self.tx().await?;
        let r = Self::by_id(&mut tx, id).await?;
        tx.commit().await?;
        r.ok_or_else(|| CatalogError::NotFound(format!("inode {id}")))
    }

    /// The path of an entry (for pending files, the path it will have).
    pub async fn path_of(&self, id: i64) -> Result<String> {
        let mut tx = self.tx().await?;
        let mut parts = Vec::new();
        let mut cur = id;
        while cur != ROOT {
            let i = Self::by_id(&mut tx, cur)
                .await?
                .ok_or_else(|| CatalogError::NotFound(format!("inode {id}")))?;
            parts.push(i.name);
            cur = i.parent;
            if parts.len() > 4096 {
                return Err(CatalogError::Database("parent loop".into()));
            }
        }
        tx.commit().await?;
        parts.reverse();
        Ok(format!("/{}", parts.join("/")))
    }

    /// Entries of a directory in name order, starting after `after`, at most `limit`.
    pub async fn list(&self, path: &str, after: Option<&str>, limit: u32) -> Result<Vec<Inode>> {
        let mut tx = self.tx().await?;
        let dir = Self::resolve(&mut tx, path)
            .await?
            .ok_or_else(|| CatalogError::NotFound(path.to_string()))?;
        if dir.kind != Kind::Dir {
            tx.commit().await?;
            return Ok(vec![dir]);
        }
        let q = format!(
            "SELECT {INODE_COLS} FROM inodes WHERE parent = $1 AND name > $2 AND id <> $3 ORDER BY name LIMIT $4"
        );
        let rows = sqlx::query(&q)
            .bind(dir.id)
            .bind(after.unwrap_or(""))
            .bind(ROOT)
            .bind(limit as i64)
            .fetch_all(&mut *tx)
            .await?;
        tx.commit().await?;
        rows.iter().map(inode_from).collect()
    }

    async fn insert(
        tx: &mut Tx<'_>,
        parent: i64,
        name: &str,
        kind: Kind,
        e: &NewEntry,
    ) -> Result<Inode> {
        let q = format!(
            "INSERT INTO inodes (parent, name, kind, owner, grp, mode, size, mtime_ns, checksum) \
             VALUES ($1, $2, $3, $4, $5, $6, 0, $7, '') RETURNING {INODE_COLS}"
        );
        let row = sqlx::query(&q)
            .bind(parent)
            .bind(name)
            .bind(if kind == Kind::Dir { 0i64 } else { 1 })
            .bind(&e.owner)
            .bind(&e.group)
            .bind(e.mode as i64)
            .bind(e.mtime_ns)
            .fetch_one(&mut **tx)
            .await?;
        inode_from(&row)
    }

    /// Creates a directory (and, with `parents`, missing ancestors; an existing directory is
    /// then not an error).
    pub async fn mkdir(&self, path: &str, e: &NewEntry, parents: bool) -> Result<Inode> {
        let mut tx = self.tx().await?;
        let r = Self::mkdir_in(&mut tx, path, e, parents).await;
        match r {
            Ok(i) => {
                tx.commit().await?;
                Ok(i)
            }
            Err(err) => {
                tx.rollback().await?;
                Err(err)
            }
        }
    }

    async fn mkdir_in(tx: &mut Tx<'_>, path: &str, e: &NewEntry, parents: bool) -> Result<Inode> {
        let norm = normalize(path)?;
        if norm == "/" {
            return if parents {
                Ok(Self::by_id(tx, ROOT).await?.expect("root"))
            } else {
                Err(CatalogError::Exists(norm))
            };
        }
        let mut cur = Self::by_id(tx, ROOT).await?.expect("root");
        let parts: Vec<&str> = norm.split('/').filter(|p| !p.is_empty()).collect();
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let so_far = format!("/{}", parts[..=i].join("/"));
            match Self::child(tx, cur.id, part).await? {
                Some(c) if c.kind == Kind::Dir => {
                    if last && !parents {
                        return Err(CatalogError::Exists(so_far));
                    }
                    cur = c;
                }
                Some(_) if last => return Err(CatalogError::Exists(so_far)),
                Some(_) => return Err(CatalogError::NotADirectory(so_far)),
                None if !last && !parents => return Err(CatalogError::NotFound(so_far)),
                None => cur = Self::insert(tx, cur.id, part, Kind::Dir, e).await?,
            }
        }
        Ok(cur)
    }

    /// Starts a file at `path`: a pending entry, invisible until committed. An existing file at
    /// the path stays visible until the commit replaces it.
    pub async fn create_pending(&self, path: &str, e: &NewEntry) -> Result<Inode> {
        let mut tx = self.tx().await?;
        let r = Self::create_pending_in(&mut tx, path, e).await;
        finish(tx, r).await
    }

    async fn create_pending_in(tx: &mut Tx<'_>, path: &str, e: &NewEntry) -> Result<Inode> {
        let (dir, name) = Self::parent_dir(tx, path).await?;
        if let Some(existing) = Self::child(tx, dir.id, &name).await? {
            if existing.kind == Kind::Dir {
                return Err(CatalogError::IsADirectory(normalize(path)?));
            }
        }
        if Self::child(tx, -dir.id, &name).await?.is_some() {
            return Err(CatalogError::Busy(normalize(path)?));
        }
        let mut inode = Self::insert(tx, -dir.id, &name, Kind::File, e).await?;
        inode.parent = dir.id;
        Ok(inode)
    }

    /// Makes a pending file visible with its size, checksum and mtime, replacing a file of
    /// the same name (whose replicas become dead, for their nodes to remove).
    pub async fn commit_file(
        &self,
        id: i64,
        size: u64,
        checksum: &str,
        mtime_ns: i64,
    ) -> Result<Inode> {
        let mut tx = self.tx().await?;
        let r = Self::commit_in(&mut tx, id, size, checksum, mtime_ns).await;
        finish(tx, r).await
    }

    async fn commit_in(
        tx: &mut Tx<'_>,
        id: i64,
        size: u64,
        checksum: &str,
        mtime_ns: i64,
    ) -> Result<Inode> {
        let row = sqlx::query("SELECT parent, name FROM inodes WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut **tx)
            .await?;
        let Some(row) = row else {
            return Err(CatalogError::NotFound(format!("inode {id}")));
        };
        let parent: i64 = row.try_get("parent")?;
        let name: String = row.try_get("name")?;
        if parent > 0 {
            return Err(CatalogError::Invalid(format!(
                "inode {id} is already committed"
            )));
        }
        if let Some(old) = Self::child(tx, -parent, &name).await? {
            if old.kind == Kind::Dir {
                return Err(CatalogError::IsADirectory(name));
            }
            Self::bury(tx, &[old.id]).await?;
            sqlx::query("DELETE FROM inodes WHERE id = $1")
                .bind(old.id)
                .execute(&mut **tx)
                .await?;
        }
        let q = format!(
            "UPDATE inodes SET parent = $1, size = $2, checksum = $3, mtime_ns = $4 WHERE id = $5 RETURNING {INODE_COLS}"
        );
        let row = sqlx::query(&q)
            .bind(-parent)
            .bind(size as i64)
            .bind(checksum)
            .bind(mtime_ns)
            .bind(id)
            .fetch_one(&mut **tx)
            .await?;
        inode_from(&row)
    }

    /// Drops a pending file (its replicas become dead).
    pub async fn abort_pending(&self, id: i64) -> Result<()> {
        let mut tx = self.tx().await?;
        let r = async {
            let i = Self::by_id(&mut tx, id)
                .await?
                .ok_or_else(|| CatalogError::NotFound(format!("inode {id}")))?;
            if !i.pending {
                return Err(CatalogError::Invalid(format!("inode {id} is not pending")));
            }
            Self::bury(&mut tx, &[id]).await?;
            sqlx::query("DELETE FROM inodes WHERE id = $1")
                .bind(id)
                .execute(&mut *tx)
                .await?;
            Ok(())
        }
        .await;
        finish(tx, r).await
    }

    /// Moves the replicas of these inodes to the dead list.
    async fn bury(tx: &mut Tx<'_>, ids: &[i64]) -> Result<()> {
        let now = now_ms();
        for id in ids {
            sqlx::query(
                "INSERT INTO dead_replicas (inode, node, since_ms) SELECT inode, node, $2 FROM replicas WHERE inode = $1 \
                 ON CONFLICT (inode, node) DO NOTHING",
            )
            .bind(id)
            .bind(now)
            .execute(&mut **tx)
            .await?;
            sqlx::query("DELETE FROM replicas WHERE inode = $1")
                .bind(id)
                .execute(&mut **tx)
                .await?;
        }
        Ok(())
    }

    /// Renames or moves an entry. A file may replace a file; nothing replaces a directory.
    pub async fn rename(&self, from: &str, to: &str) -> Result<Inode> {
        let mut tx = self.tx().await?;
        let r = async {
            let src = Self::resolve(&mut tx, from)
                .await?
                .ok_or_else(|| CatalogError::NotFound(from.to_string()))?;
            if src.id == ROOT {
                return Err(CatalogError::Invalid("cannot move the root".into()));
            }
            let (dir, name) = Self::parent_dir(&mut tx, to).await?;
            // A directory cannot move into itself or below itself.
            let mut up = dir.id;
            while up != 0 {
                if up == src.id {
                    return Err(CatalogError::Invalid(format!(
                        "cannot move {from} into itself"
                    )));
                }
                up = Self::by_id(&mut tx, up)
                    .await?
                    .map(|i| i.parent)
                    .filter(|p| *p != 0)
                    .unwrap_or(0);
            }
            if let Some(existing) = Self::child(&mut tx, dir.id, &name).await? {
                if existing.id == src.id {
                    return Ok(src);
                }
                if existing.kind == Kind::Dir || src.kind == Kind::Dir {
                    return Err(CatalogError::Exists(normalize(to)?));
                }
                Self::bury(&mut tx, &[existing.id]).await?;
                sqlx::query("DELETE FROM inodes WHERE id = $1")
                    .bind(existing.id)
                    .execute(&mut *tx)
                    .await?;
            }
            let q = format!(
                "UPDATE inodes SET parent = $1, name = $2 WHERE id = $3 RETURNING {INODE_COLS}"
            );
            let row = sqlx::query(&q)
                .bind(dir.id)
                .bind(&name)
                .bind(src.id)
                .fetch_one(&mut *tx)
                .await?;
            inode_from(&row)
        }
        .await;
        finish(tx, r).await
    }

    /// Removes a file or an empty directory; with `recursive` a whole tree. Returns the number
    /// of entries removed. Their replicas become dead.
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<u64> {
        let mut tx = self.tx().await?;
        let r = async {
            let target = Self::resolve(&mut tx, path).await?.ok_or_else(|| CatalogError::NotFound(path.to_string()))?;
            if target.id == ROOT {
                return Err(CatalogError::Invalid("cannot remove the root".into()));
            }
            let ids: Vec<i64> = if target.kind == Kind::Dir {
                let rows = sqlx::query(
                    "WITH RECURSIVE t(id) AS (SELECT $1 UNION ALL SELECT i.id FROM inodes i JOIN t ON i.parent = t.id OR i.parent = -t.id) SELECT id FROM t",
                )
                .bind(target.id)
                .fetch_all(&mut *tx)
                .await?;
                let ids: Vec<i64> = rows.iter().map(|r| r.try_get::<i64, _>(0)).collect::<std::result::Result<_, _>>()?;
                if ids.len() > 1 && !recursive {
                    return Err(CatalogError::NotEmpty(normalize(path)?));
                }
                ids
            } else {
                vec![target.id]
            };
            Self::bury(&mut tx, &ids).await?;
            // Children first (the unique key does not care, but foreign keys of xattrs do).
            for id in ids.iter().rev() {
                sqlx::query("DELETE FROM inodes WHERE id = $1").bind(id).execute(&mut *tx).await?;
            }
            Ok(ids.len() as u64)
        }
        .await;
        finish(tx, r).await
    }

    async fn update_attr(&self, path: &str, sql: &str, value: AttrValue<'_>) -> Result<Inode> {
        let mut tx = self.tx().await?;
        let r = async {
            let i = Self::resolve(&mut tx, path)
                .await?
                .ok_or_else(|| CatalogError::NotFound(path.to_string()))?;
            let q = format!("{sql} WHERE id = $2 RETURNING {INODE_COLS}");
            let query = match value {
                AttrValue::Int(v) => sqlx::query(&q).bind(v),
                AttrValue::Text(v) => sqlx::query(&q).bind(v.to_string()),
            };
            let row = query.bind(i.id).fetch_one(&mut *tx).await?;
            inode_from(&row)
        }
        .await;
        finish(tx, r).await
    }

    pub async fn set_mode(&self, path: &str, mode: u32) -> Result<Inode> {
        self.update_attr(
            path,
            "UPDATE inodes SET mode = $1",
            AttrValue::Int(mode as i64 & 0o7777),
        )
        .await
    }

    pub async fn set_owner(&self, path: &str, owner: &str) -> Result<Inode> {
        self.update_attr(path, "UPDATE inodes SET owner = $1", AttrValue::Text(owner))
            .await
    }

    pub async fn set_group(&self, path: &str, group: &str) -> Result<Inode> {
        self.update_attr(path, "UPDATE inodes SET grp = $1", AttrValue::Text(group))
            .await
    }

    pub async fn set_mtime(&self, path: &str, mtime_ns: i64) -> Result<Inode> {
        self.update_attr(
            path,
            "UPDATE inodes SET mtime_ns = $1",
            AttrValue::Int(mtime_ns),
        )
        .await
    }

    // ---- extended attributes ----------------------------------------------------------

    pub async fn xattr_set(&self, path: &str, name: &str, value: &[u8]) -> Result<()> {
        if name.is_empty() || name.len() > 255 || value.len() > 64 * 1024 {
            return Err(CatalogError::Invalid(
                "xattr names are 1-255 bytes, values at most 64 KiB".into(),
            ));
        }
        let mut tx = self.tx().await?;
        let r = async {
            let i = Self::resolve(&mut tx, path).await?.ok_or_else(|| CatalogError::NotFound(path.to_string()))?;
            sqlx::query(
                "INSERT INTO xattrs (inode, name, value) VALUES ($1, $2, $3) ON CONFLICT (inode, name) DO UPDATE SET value = excluded.value",
            )
            .bind(i.id)
            .bind(name)
            .bind(value.to_vec())
            .execute(&mut *tx)
            .await?;
            Ok(())
        }
        .await;
        finish(tx, r).await
    }

    pub async fn xattr_get(&self, path: &str, name: &str) -> Result<Option<Vec<u8>>> {
        let mut tx = self.tx().await?;
        let r = async {
            let i = Self::resolve(&mut tx, path)
                .await?
                .ok_or_else(|| CatalogError::NotFound(path.to_string()))?;
            let row = sqlx::query("SELECT value FROM xattrs WHERE inode = $1 AND name = $2")
                .bind(i.id)
                .bind(name)
                .fetch_optional(&mut *tx)
                .await?;
            Ok(row.map(|r| r.try_get::<Vec<u8>, _>(0)).transpose()?)
        }
        .await;
        finish(tx, r).await
    }

    pub async fn xattr_list(&self, path: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut tx = self.tx().await?;
        let r = async {
            let i = Self::resolve(&mut tx, path)
                .await?
                .ok_or_else(|| CatalogError::NotFound(path.to_string()))?;
            let rows = sqlx::query("SELECT name, value FROM xattrs WHERE inode = $1 ORDER BY name")
                .bind(i.id)
                .fetch_all(&mut *tx)
                .await?;
            rows.iter()
                .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<Vec<u8>, _>(1)?)))
                .collect()
        }
        .await;
        finish(tx, r).await
    }

    pub async fn xattr_remove(&self, path: &str, name: &str) -> Result<bool> {
        let mut tx = self.tx().await?;
        let r = async {
            let i = Self::resolve(&mut tx, path)
                .await?
                .ok_or_else(|| CatalogError::NotFound(path.to_string()))?;
            let done = sqlx::query("DELETE FROM xattrs WHERE inode = $1 AND name = $2")
                .bind(i.id)
                .bind(name)
                .execute(&mut *tx)
                .await?;
            Ok(done.rows_affected() > 0)
        }
        .await;
        finish(tx, r).await
    }

    // ---- replicas --------------------------------------------------------------------

    /// Records (or updates) the replica of `inode` on `node`.
    pub async fn set_replica(
        &self,
        inode: i64,
        node: &str,
        state: ReplicaState,
        checksum: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO replicas (inode, node, state, checksum, updated_ms) VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (inode, node) DO UPDATE SET state = excluded.state, checksum = excluded.checksum, updated_ms = excluded.updated_ms",
        )
        .bind(inode)
        .bind(node)
        .bind(state.to_i64())
        .bind(checksum)
        .bind(now_ms())
        .execute(&self.pool)
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(d) if d.message().to_ascii_lowercase().contains("foreign key") => {
                CatalogError::NotFound(format!("inode {inode} or node {node}"))
            }
            other => other.into(),
        })?;
        Ok(())
    }

    /// Marks a replica complete and, if its file is still pending, commits the file: one
    /// transaction, so a file becomes visible exactly when its first verified copy exists.
    pub async fn complete_replica(
        &self,
        inode: i64,
        node: &str,
        size: u64,
        checksum: &str,
        mtime_ns: i64,
    ) -> Result<Inode> {
        let mut tx = self.tx().await?;
        let r = async {
            let i = Self::by_id(&mut tx, inode).await?.ok_or_else(|| CatalogError::NotFound(format!("inode {inode}")))?;
            if !i.pending && (i.size != size || i.checksum != checksum) {
                return Err(CatalogError::Invalid(format!(
                    "replica of inode {inode} on {node} does not match the file (size {size}, checksum {checksum})"
                )));
            }
            sqlx::query(
                "INSERT INTO replicas (inode, node, state, checksum, updated_ms) VALUES ($1, $2, 1, $3, $4) \
                 ON CONFLICT (inode, node) DO UPDATE SET state = 1, checksum = excluded.checksum, updated_ms = excluded.updated_ms",
            )
            .bind(inode)
            .bind(node)
            .bind(checksum)
            .bind(now_ms())
            .execute(&mut *tx)
            .await?;
            if i.pending { Self::commit_in(&mut tx, inode, size, checksum, mtime_ns).await } else { Ok(i) }
        }
        .await;
        finish(tx, r).await
    }

    pub async fn replicas(&self, inode: i64) -> Result<Vec<Replica>> {
        let rows = sqlx::query("SELECT inode, node, state, checksum, updated_ms FROM replicas WHERE inode = $1 ORDER BY node")
            .bind(inode)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(replica_from).collect()
    }

    /// Every replica a node is supposed to hold.
    pub async fn node_replicas(&self, node: &str) -> Result<Vec<Replica>> {
        let rows = sqlx::query("SELECT inode, node, state, checksum, updated_ms FROM replicas WHERE node = $1 ORDER BY inode")
            .bind(node)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(replica_from).collect()
    }

    /// Drops a replica record (its file stays on the node's dead list for removal).
    pub async fn remove_replica(&self, inode: i64, node: &str) -> Result<()> {
        let mut tx = self.tx().await?;
        sqlx::query(
            "INSERT INTO dead_replicas (inode, node, since_ms) VALUES ($1, $2, $3) ON CONFLICT (inode, node) DO NOTHING",
        )
        .bind(inode)
        .bind(node)
        .bind(now_ms())
        .execute(&mut *tx)
        .await?;
        sqlx::query("DELETE FROM replicas WHERE inode = $1 AND node = $2")
            .bind(inode)
            .bind(node)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(())
    }

    /// Files a node should remove.
    pub async fn dead_replicas(&self, node: &str) -> Result<Vec<i64>> {
        let rows = sqlx::query("SELECT inode FROM dead_replicas WHERE node = $1 ORDER BY inode")
            .bind(node)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(|r| Ok(r.try_get::<i64, _>(0)?)).collect()
    }

    /// A node removed these files.
    pub async fn forget_dead(&self, node: &str, inodes: &[i64]) -> Result<()> {
        let mut tx = self.tx().await?;
        for i in inodes {
            sqlx::query("DELETE FROM dead_replicas WHERE inode = $1 AND node = $2")
                .bind(i)
                .bind(node)
                .execute(&mut *tx)
                .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    /// Whether an inode exists at all (committed or pending).
    pub async fn exists(&self, inode: i64) -> Result<bool> {
        let row = sqlx::query("SELECT 1 FROM inodes WHERE id = $1")
            .bind(inode)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    // ---- nodes -----------------------------------------------------------------------

    /// Registers a node, or updates its site, address and capacity.
    pub async fn register_node(
        &self,
        name: &str,
        site: &str,
        address: &str,
        capacity: u64,
        free: u64,
    ) -> Result<Node> {
        let now = now_ms();
        sqlx::query(
            "INSERT INTO nodes (name, site, address, capacity, free, load, heartbeat_ms, registered_ms, up) \
             VALUES ($1, $2, $3, $4, $5, 0.0, $6, $6, 1) \
             ON CONFLICT (name) DO UPDATE SET site = excluded.site, address = excluded.address, capacity = excluded.capacity, \
             free = excluded.free, heartbeat_ms = excluded.heartbeat_ms, up = 1",
        )
        .bind(name)
        .bind(site)
        .bind(address)
        .bind(capacity as i64)
        .bind(free as i64)
        .bind(now)
        .execute(&self.pool)
        .await?;
        self.node(name).await
    }

    pub async fn heartbeat(&self, name: &str, capacity: u64, free: u64, load: f64) -> Result<Node> {
        let done = sqlx::query("UPDATE nodes SET capacity = $1, free = $2, load = $3, heartbeat_ms = $4, up = 1 WHERE name = $5")
            .bind(capacity as i64)
            .bind(free as i64)
            .bind(load)
            .bind(now_ms())
            .bind(name)
            .execute(&self.pool)
            .await?;
        if done.rows_affected() == 0 {
            return Err(CatalogError::NotFound(format!("node {name}")));
        }
        self.node(name).await
    }

    pub async fn node(&self, name: &str) -> Result<Node> {
        let row = sqlx::query(
            "SELECT name, site, address, capacity, free, load, heartbeat_ms, registered_ms, up FROM nodes WHERE name = $1",
        )
        .bind(name)
        .fetch_optional(&self.pool)
        .await?;
        row.map(|r| node_from(&r))
            .transpose()?
            .ok_or_else(|| CatalogError::NotFound(format!("node {name}")))
    }

    pub async fn nodes(&self) -> Result<Vec<Node>> {
        let rows = sqlx::query(
            "SELECT name, site, address, capacity, free, load, heartbeat_ms, registered_ms, up FROM nodes ORDER BY site, name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(node_from).collect()
    }

    /// Marks nodes whose last heartbeat is older than `max_age_ms` as down; returns them.
    pub async fn expire_nodes(&self, max_age_ms: i64) -> Result<Vec<String>> {
        let cutoff = now_ms() - max_age_ms;
        let rows = sqlx::query(
            "UPDATE nodes SET up = 0 WHERE up = 1 AND heartbeat_ms < $1 RETURNING name",
        )
        .bind(cutoff)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| Ok(r.try_get::<String, _>(0)?))
            .collect()
    }

    /// Counts of entries (for reports and benchmarks).
    pub async fn count_inodes(&self) -> Result<u64> {
        let row = sqlx::query("SELECT COUNT(*) FROM inodes")
            .fetch_one(&self.pool)
            .await?;
        Ok(row.try_get::<i64, _>(0)? as u64)
    }

    pub async fn close(&self) {
        self.pool.close().await;
    }
}

enum AttrValue<'a> {
    Int(i64),
    Text(&'a str),
}

async fn finish<T>(tx: Tx<'_>, r: Result<T>) -> Result<T> {
    match r {
        Ok(v) => {
            tx.commit().await?;
            Ok(v)
        }
        Err(e) => {
            tx.rollback().await?;
            Err(e)
        }
    }
}

fn replica_from(r: &AnyRow) -> Result<Replica> {
    Ok(Replica {
        inode: r.try_get("inode")?,
        node: r.try_get("node")?,
        state: ReplicaState::from_i64(r.try_get("state")?),
        checksum: r.try_get("checksum")?,
        updated_ms: r.try_get("updated_ms")?,
    })
}

fn node_from(r: &AnyRow) -> Result<Node> {
    Ok(Node {
        name: r.try_get("name")?,
        site: r.try_get("site")?,
        address: r.try_get("address")?,
        capacity: r.try_get::<i64, _>("capacity")? as u64,
        free: r.try_get::<i64, _>("free")? as u64,
        load: r.try_get("load")?,
        heartbeat_ms: r.try_get("heartbeat_ms")?,
        registered_ms: r.try_get("registered_ms")?,
        up: r.try_get::<i64, _>("up")? != 0,
    })
}

/// A database URL without its password, for messages.
pub fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => {
            let creds = &url[s + 3..at];
            match creds.find(':') {
                Some(c) => format!("{}{}:***{}", &url[..s + 3], &creds[..c], &url[at..]),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}
