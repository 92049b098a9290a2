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

mod cache;
pub mod conformance;
mod history;
mod jobs;
mod migrations;
mod paths;

pub use cache::DentryCache;
pub use history::{TransferFile, TransferFilter, TransferRecord};
pub use jobs::{JobFile, JobFilter, JobRecord, JobState, NewJob};
pub use paths::{join, normalize, parent_and_name};

use serde::{Deserialize, Serialize};
use sqlx::any::{AnyConnectOptions, AnyPoolOptions, AnyRow};
use sqlx::{AnyConnection, AnyPool, Row};
use std::collections::{HashMap, HashSet};
use std::str::FromStr;
use std::sync::Arc;
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
    /// Refused by a rule of the catalog (e.g. a node registering with another certificate).
    #[error("{0}")]
    Denied(String),
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
    /// Arrived over private (TLS) data streams: its copies travel privately too.
    pub private: bool,
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

/// A replica a node reports written and verified (see [`Catalog::complete_replicas`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WrittenReplica {
    pub inode: i64,
    pub size: u64,
    pub checksum: String,
    pub mtime_ns: i64,
}

/// One physical copy of a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Replica {
    pub inode: i64,
    pub node: String,
    pub state: ReplicaState,
    pub checksum: String,
    pub updated_ms: i64,
    /// When the record was made (0: before this was recorded). A drain tells the copies it
    /// made from those the file had by this.
    pub created_ms: i64,
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
    /// When an administrator began draining it (ms since the epoch; 0: not draining). A
    /// draining node takes no new replicas and its replicas are moved off.
    pub drain_ms: i64,
    /// Complete replicas it held when its drain began.
    pub drain_replicas: u64,
}

/// A node's registration (see [`Catalog::register_node_with_key`]).
#[derive(Clone, Debug)]
pub struct NodeRegistration<'a> {
    pub name: &'a str,
    pub site: &'a str,
    pub address: &'a str,
    pub capacity: u64,
    pub free: u64,
    /// A fresh key, used if the node gets a new one; empty to leave keys alone.
    pub new_key: &'a [u8],
    /// The fingerprint of the certificate the node registers with.
    pub cert: &'a str,
    /// The enrolment lists this very certificate: it may replace another one.
    pub may_rotate: bool,
}

/// What [`Catalog::remove_node_forced`] dropped.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ForcedRemoval {
    /// Replica records of the node (any state).
    pub replicas: u64,
    /// Files (non-empty) that had no complete replica on any other node: their data is lost.
    pub orphaned: Vec<i64>,
}

/// The outcome of a checked change that failed: refused by its authorization (with the
/// caller's reason), or failed in the catalog.
#[derive(Debug, PartialEq, Eq)]
pub enum Checked<E> {
    Refused(E),
    Catalog(CatalogError),
}

impl<E> From<CatalogError> for Checked<E> {
    fn from(e: CatalogError) -> Self {
        Checked::Catalog(e)
    }
}

/// An authorization's decision inside a checked change: a refusal is kept in `slot` for the
/// caller, and the change's transaction is rolled back.
fn keep_refusal<T, E>(slot: &mut Option<E>, decision: std::result::Result<T, E>) -> Result<T> {
    decision.map_err(|e| {
        *slot = Some(e);
        CatalogError::Denied("refused".into())
    })
}

/// A checked change's result: a refusal wins over the rollback error it caused.
fn checked<T, E>(r: Result<T>, refused: Option<E>) -> std::result::Result<T, Checked<E>> {
    match (r, refused) {
        (_, Some(e)) => Err(Checked::Refused(e)),
        (Ok(v), None) => Ok(v),
        (Err(e), None) => Err(Checked::Catalog(e)),
    }
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
    /// Directory entries in memory, when this process owns the database (SQLite).
    cache: Option<Arc<DentryCache>>,
    /// SQLite has one writer at a time; taking turns here avoids its busy errors (a deferred
    /// transaction that reads, then writes after another writer committed, cannot proceed).
    /// PostgreSQL orders writers itself.
    write_lock: Option<Arc<tokio::sync::Mutex<()>>>,
    /// PostgreSQL: entries created since the planner's statistics were last refreshed.
    created_since_analyze: Arc<std::sync::atomic::AtomicU64>,
}

/// Entries created after which PostgreSQL's statistics are refreshed. After a bulk load
/// autovacuum may not have analyzed the table yet, and the planner, still believing it small,
/// answers lookups with sequential scans (seen: stats 50x slower right after 200,000 creates).
const ANALYZE_EVERY: u64 = 20_000;

const INODE_COLS: &str =
    "id, parent, name, kind, owner, grp, mode, size, mtime_ns, checksum, flags";

/// `inodes.flags`: the file arrived privately.
const FLAG_PRIVATE: i64 = 1;

/// The checksum of an empty file.
pub const EMPTY_CHECKSUM: &str = "crc32c:00000000";

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
        private: row.try_get::<i64, _>("flags")? & FLAG_PRIVATE != 0,
    })
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or(0)
}

type Tx<'a> = sqlx::Transaction<'a, sqlx::Any>;
type Key = (i64, String);

/// A write transaction: holds the write turn (SQLite), remembers which directory entries it
/// changed so that the cache forgets them once it has committed.
struct WTx {
    tx: Tx<'static>,
    touched: HashSet<Key>,
    _turn: Option<tokio::sync::OwnedMutexGuard<()>>,
}

impl WTx {
    fn touch(&mut self, parent: i64, name: &str) {
        if parent > 0 {
            self.touched.insert((parent, name.to_string()));
        }
    }
}

/// What a lookup may do with the cache.
#[derive(Clone, Copy)]
enum Scope<'a> {
    /// A read that started at this cache generation.
    Read(u64),
    /// Inside a write transaction: entries it changed must not be cached from it.
    Write(&'a HashSet<Key>),
}

/// How a file is created by [`Catalog::create_files`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CreateKind {
    /// Data follows: the file is pending until its first replica is verified.
    Pending,
    /// An empty file, visible at once (it needs no replica).
    Empty,
}

/// One file to create.
#[derive(Clone, Debug)]
pub struct CreateItem {
    pub path: String,
    pub entry: NewEntry,
    pub kind: CreateKind,
    /// Its data arrives privately (TLS): copies of it must travel privately too.
    pub private: bool,
}

/// What an inventory reconciliation found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Files on the node that the catalog does not know: removed after the grace period.
    pub orphans: Vec<i64>,
    /// Replicas the catalog lists that the node lacks: now marked missing.
    pub missing: Vec<i64>,
    /// Replicas whose size on the node differs from the file's: now marked damaged.
    pub damaged: Vec<i64>,
    /// Replicas the node holds as the catalog says.
    pub known: u64,
}

impl Catalog {
    /// Opens (creating if needed) a catalog: `sqlite:PATH`, `sqlite::memory:` or
    /// `postgres://user@host/db`, and brings its schema up to date. A SQLite catalog belongs
    /// to this process (the caller makes sure of that) and caches directory entries; a
    /// PostgreSQL catalog may be shared by several processes.
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
                if !memory {
                    create_private(url)?;
                }
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
                            conn.execute("PRAGMA cache_size = -65536").await?;
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
            Backend::Sqlite => {
                migrations::migrator(migrations::SQLITE)
                    .await?
                    .run(&pool)
                    .await?
            }
            Backend::Postgres => {
                migrations::migrator(migrations::POSTGRES)
                    .await?
                    .run(&pool)
                    .await?
            }
        }
        let sqlite = backend == Backend::Sqlite;
        Ok(Self {
            pool,
            backend,
            cache: sqlite.then(|| Arc::new(DentryCache::default())),
            write_lock: sqlite.then(|| Arc::new(tokio::sync::Mutex::new(()))),
            created_since_analyze: Default::default(),
        })
    }

    /// Counts created entries; on PostgreSQL, refreshes the planner's statistics in the
    /// background every [`ANALYZE_EVERY`] of them.
    fn note_created(&self, n: u64) {
        use std::sync::atomic::Ordering;
        if self.backend != Backend::Postgres || n == 0 {
            return;
        }
        let before = self.created_since_analyze.fetch_add(n, Ordering::Relaxed);
        if before < ANALYZE_EVERY && before + n >= ANALYZE_EVERY {
            let (pool, counter) = (self.pool.clone(), self.created_since_analyze.clone());
            tokio::spawn(async move {
                // Best effort: autovacuum does it later anyway.
                let _ = sqlx::query("ANALYZE inodes").execute(&pool).await;
                counter.store(0, Ordering::Relaxed);
            });
        }
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The directory-entry cache, if this catalog has one.
    pub fn cache(&self) -> Option<&DentryCache> {
        self.cache.as_deref()
    }

    async fn wtx(&self) -> Result<WTx> {
        let turn = match &self.write_lock {
            Some(l) => Some(l.clone().lock_owned().await),
            None => None,
        };
        Ok(WTx {
            tx: self.pool.begin().await?,
            touched: HashSet::new(),
            _turn: turn,
        })
    }

    /// Runs `work` in a write transaction: committed when it succeeds (see [`Self::done`]),
    /// rolled back when it fails.
    async fn write<T>(&self, work: impl AsyncFnOnce(&mut WTx) -> Result<T>) -> Result<T> {
        let mut w = self.wtx().await?;
        let r = work(&mut w).await;
        self.done(w, r).await
    }

    /// Commits (or, on error, rolls back) a write transaction; then the cache forgets what it
    /// changed, before the next writer's turn.
    async fn done<T>(&self, w: WTx, r: Result<T>) -> Result<T> {
        let WTx {
            tx, touched, _turn, ..
        } = w;
        match r {
            Ok(v) => {
                let committed = tx.commit().await;
                if let Some(c) = &self.cache {
                    c.invalidate(touched.iter());
                }
                committed?;
                Ok(v)
            }
            Err(e) => {
                tx.rollback().await?;
                Err(e)
            }
        }
    }

    fn read_scope(&self) -> u64 {
        self.cache.as_ref().map(|c| c.generation()).unwrap_or(0)
    }

    // ---- namespace -------------------------------------------------------------------

    async fn child_db(c: &mut AnyConnection, parent: i64, name: &str) -> Result<Option<Inode>> {
        let q = format!("SELECT {INODE_COLS} FROM inodes WHERE parent = $1 AND name = $2");
        let row = sqlx::query(&q)
            .bind(parent)
            .bind(name)
            .fetch_optional(&mut *c)
            .await?;
        row.map(|r| inode_from(&r)).transpose()
    }

    /// The committed entry `name` in directory `parent` (or, with a negated parent, the
    /// pending one), from the cache when it has it.
    async fn child(
        &self,
        c: &mut AnyConnection,
        parent: i64,
        name: &str,
        scope: Scope<'_>,
    ) -> Result<Option<Inode>> {
        let cache = match &self.cache {
            Some(cache) if parent > 0 => cache,
            _ => return Self::child_db(c, parent, name).await,
        };
        if let Some(hit) = cache.get(parent, name) {
            return Ok(Some(hit));
        }
        let generation = match scope {
            Scope::Read(g) => g,
            Scope::Write(touched) => {
                if touched.contains(&(parent, name.to_string())) {
                    return Self::child_db(c, parent, name).await;
                }
                cache.generation()
            }
        };
        let found = Self::child_db(c, parent, name).await?;
        if let Some(i) = &found {
            cache.insert(generation, i);
        }
        Ok(found)
    }

    async fn by_id(c: &mut AnyConnection, id: i64) -> Result<Option<Inode>> {
        let q = format!("SELECT {INODE_COLS} FROM inodes WHERE id = $1");
        let row = sqlx::query(&q).bind(id).fetch_optional(&mut *c).await?;
        row.map(|r| inode_from(&r)).transpose()
    }

    async fn root(c: &mut AnyConnection) -> Result<Inode> {
        Self::by_id(c, ROOT)
            .await?
            .ok_or_else(|| CatalogError::Database("root directory missing".into()))
    }

    /// The root directory, from the cache when there is one.
    async fn root_cached(&self, c: &mut AnyConnection) -> Result<Inode> {
        let Some(cache) = &self.cache else {
            return Self::root(c).await;
        };
        if let Some(r) = cache.get(0, "") {
            return Ok(r);
        }
        let r = Self::root(c).await?;
        cache.insert(cache.generation(), &r);
        Ok(r)
    }

    /// Resolves a path (no pending files); `Ok(None)` when a component does not exist.
    async fn resolve(
        &self,
        c: &mut AnyConnection,
        path: &str,
        scope: Scope<'_>,
    ) -> Result<Option<Inode>> {
        let norm = normalize(path)?;
        let mut cur = self.root_cached(c).await?;
        for part in norm.split('/').filter(|p| !p.is_empty()) {
            if cur.kind != Kind::Dir {
                return Err(CatalogError::NotADirectory(path.to_string()));
            }
            match self.child(c, cur.id, part, scope).await? {
                Some(next) => cur = next,
                None => return Ok(None),
            }
        }
        Ok(Some(cur))
    }

    /// The parent directory of `path` and the final name; errors if the parent is missing.
    async fn parent_dir(
        &self,
        c: &mut AnyConnection,
        path: &str,
        scope: Scope<'_>,
    ) -> Result<(Inode, String)> {
        let (parent, name) = parent_and_name(path)?;
        let dir = self
            .resolve(c, &parent, scope)
            .await?
            .ok_or_else(|| CatalogError::NotFound(parent.clone()))?;
        if dir.kind != Kind::Dir {
            return Err(CatalogError::NotADirectory(parent));
        }
        Ok((dir, name))
    }

    /// The entry at `path`, if any.
    pub async fn lookup(&self, path: &str) -> Result<Option<Inode>> {
        let scope = Scope::Read(self.read_scope());
        let mut c = self.pool.acquire().await?;
        self.resolve(&mut c, path, scope).await
    }

    /// The entry at `path`.
    pub async fn stat(&self, path: &str) -> Result<Inode> {
        self.lookup(path)
            .await?
            .ok_or_else(|| CatalogError::NotFound(path.to_string()))
    }

    /// The entries along `path`, root first, as far as they exist: the last one is the entry
    /// itself when the result has one more element than the path has components. Used to
    /// check permissions of every directory on the way.
    pub async fn lookup_chain(&self, path: &str) -> Result<Vec<Inode>> {
        let norm = normalize(path)?;
        let scope = Scope::Read(self.read_scope());
        let mut c = self.pool.acquire().await?;
        self.chain_on(&mut c, &norm, scope).await
    }

    /// The entries along the normalized path `norm` on connection `c` (a transaction's, for
    /// a check and the change it guards to see the same entries): root first, as far as
    /// they exist. A file before the last component is an error.
    async fn chain_on(
        &self,
        c: &mut AnyConnection,
        norm: &str,
        scope: Scope<'_>,
    ) -> Result<Vec<Inode>> {
        let mut chain = vec![self.root_cached(c).await?];
        for part in norm.split('/').filter(|p| !p.is_empty()) {
            let cur = chain.last().expect("root");
            if cur.kind != Kind::Dir {
                return Err(CatalogError::NotADirectory(chain_path(&chain)));
            }
            match self.child(c, cur.id, part, scope).await? {
                Some(next) => chain.push(next),
                None => break,
            }
        }
        Ok(chain)
    }

    /// Several lookups on one connection.
    pub async fn lookup_many(&self, paths: &[String]) -> Result<Vec<Result<Option<Inode>>>> {
        let scope = Scope::Read(self.read_scope());
        let mut c = self.pool.acquire().await?;
        let mut out = Vec::with_capacity(paths.len());
        for p in paths {
            out.push(self.resolve(&mut c, p, scope).await);
        }
        Ok(out)
    }

    /// An entry by id (pending files included).
    pub async fn inode(&self, id: i64) -> Result<Inode> {
        let mut c = self.pool.acquire().await?;
        Self::by_id(&mut c, id)
            .await?
            .ok_or_else(|| CatalogError::NotFound(format!("inode {id}")))
    }

    /// The path of an entry (for pending files, the path it will have).
    pub async fn path_of(&self, id: i64) -> Result<String> {
        let mut c = self.pool.acquire().await?;
        let mut parts = Vec::new();
        let mut cur = id;
        while cur != ROOT {
            let i = Self::by_id(&mut c, cur)
                .await?
                .ok_or_else(|| CatalogError::NotFound(format!("inode {id}")))?;
            parts.push(i.name);
            cur = i.parent;
            if parts.len() > 4096 {
                return Err(CatalogError::Database("parent loop".into()));
            }
        }
        parts.reverse();
        Ok(format!("/{}", parts.join("/")))
    }

    /// Entries of a directory in name order, starting after `after`, at most `limit`.
    pub async fn list(&self, path: &str, after: Option<&str>, limit: u32) -> Result<Vec<Inode>> {
        let scope = Scope::Read(self.read_scope());
        let mut c = self.pool.acquire().await?;
        let dir = self
            .resolve(&mut c, path, scope)
            .await?
            .ok_or_else(|| CatalogError::NotFound(path.to_string()))?;
        if dir.kind != Kind::Dir {
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
            .fetch_all(&mut *c)
            .await?;
        rows.iter().map(inode_from).collect()
    }

    /// Every committed file below `path` (or `path` itself if it is a file), with its path,
    /// in path order. Directories are not listed.
    pub async fn files_below(&self, path: &str) -> Result<Vec<(String, Inode)>> {
        let top = self.stat(path).await?;
        let base = normalize(path)?;
        if top.kind == Kind::File {
            return Ok(vec![(base, top)]);
        }
        let mut c = self.pool.acquire().await?;
        let q = format!(
            "WITH RECURSIVE t(id) AS (SELECT $1 UNION ALL SELECT i.id FROM inodes i JOIN t ON i.parent = t.id WHERE i.kind = 0 AND i.id <> $2) \
             SELECT {INODE_COLS} FROM inodes WHERE parent IN (SELECT id FROM t) AND id <> $2"
        );
        let rows = sqlx::query(&q)
            .bind(top.id)
            .bind(ROOT)
            .fetch_all(&mut *c)
            .await?;
        let all: Vec<Inode> = rows.iter().map(inode_from).collect::<Result<_>>()?;
        let mut dirs: HashMap<i64, (i64, String)> = HashMap::new();
        for i in &all {
            if i.kind == Kind::Dir {
                dirs.insert(i.id, (i.parent, i.name.clone()));
            }
        }
        let mut path_cache: HashMap<i64, String> = HashMap::new();
        path_cache.insert(top.id, base.clone());
        fn dir_path(
            id: i64,
            dirs: &HashMap<i64, (i64, String)>,
            cache: &mut HashMap<i64, String>,
        ) -> String {
            if let Some(p) = cache.get(&id) {
                return p.clone();
            }
            let (parent, name) = dirs.get(&id).cloned().unwrap_or((0, String::new()));
            let p = join(&dir_path(parent, dirs, cache), &name);
            cache.insert(id, p.clone());
            p
        }
        let mut out: Vec<(String, Inode)> = all
            .into_iter()
            .filter(|i| i.kind == Kind::File)
            .map(|i| {
                let p = join(&dir_path(i.parent, &dirs, &mut path_cache), &i.name);
                (p, i)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    /// Every directory below `path`, parents before children (for recreating a tree).
    pub async fn dirs_below(&self, path: &str) -> Result<Vec<(String, Inode)>> {
        let top = self.stat(path).await?;
        let base = normalize(path)?;
        if top.kind != Kind::Dir {
            return Ok(Vec::new());
        }
        let mut c = self.pool.acquire().await?;
        let below = Self::dirs_below_on(&mut c, &top, &base).await?;
        Ok(std::iter::once((base, top)).chain(below).collect())
    }

    async fn insert(
        w: &mut WTx,
        parent: i64,
        name: &str,
        kind: Kind,
        e: &NewEntry,
    ) -> Result<Inode> {
        let q = format!(
            "INSERT INTO inodes (parent, name, kind, owner, grp, mode, size, mtime_ns, checksum, ctime_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, 0, $7, '', $8) RETURNING {INODE_COLS}"
        );
        let row = sqlx::query(&q)
            .bind(parent)
            .bind(name)
            .bind(if kind == Kind::Dir { 0i64 } else { 1 })
            .bind(&e.owner)
            .bind(&e.group)
            .bind(e.mode as i64)
            .bind(e.mtime_ns)
            .bind(now_ms())
            .fetch_one(&mut *w.tx)
            .await?;
        w.touch(parent, name);
        inode_from(&row)
    }

    /// Creates a directory (and, with `parents`, missing ancestors; an existing directory is
    /// then not an error).
    pub async fn mkdir(&self, path: &str, e: &NewEntry, parents: bool) -> Result<Inode> {
        self.write(async |w| self.mkdir_in(w, path, e, parents).await)
            .await
    }

    async fn mkdir_in(
        &self,
        w: &mut WTx,
        path: &str,
        e: &NewEntry,
        parents: bool,
    ) -> Result<Inode> {
        let norm = normalize(path)?;
        let mut cur = Self::root(&mut w.tx).await?;
        if norm == "/" {
            return if parents {
                Ok(cur)
            } else {
                Err(CatalogError::Exists(norm))
            };
        }
        let parts: Vec<&str> = norm.split('/').filter(|p| !p.is_empty()).collect();
        for (i, part) in parts.iter().enumerate() {
            let last = i + 1 == parts.len();
            let so_far = format!("/{}", parts[..=i].join("/"));
            match self
                .child(&mut w.tx, cur.id, part, Scope::Write(&w.touched))
                .await?
            {
                Some(c) if c.kind == Kind::Dir => {
                    if last && !parents {
                        return Err(CatalogError::Exists(so_far));
                    }
                    cur = c;
                }
                Some(_) if last => return Err(CatalogError::Exists(so_far)),
                Some(_) => return Err(CatalogError::NotADirectory(so_far)),
                None if !last && !parents => return Err(CatalogError::NotFound(so_far)),
                None => cur = Self::insert(w, cur.id, part, Kind::Dir, e).await?,
            }
        }
        Ok(cur)
    }

    /// Creates directory `path` as [`mkdir`](Self::mkdir) does, if `authorize` approves what
    /// this same transaction finds along the path. It is given the entries that exist (root
    /// first; the entry itself last if it exists) and how many components are missing, and it
    /// returns the entry to create (whose group may follow the parent's). The check and the
    /// creation see one state of the catalog: no rename, chmod or removal slips between them.
    pub async fn mkdir_checked<E>(
        &self,
        path: &str,
        parents: bool,
        authorize: impl FnOnce(&[Inode], usize) -> std::result::Result<NewEntry, E>,
    ) -> std::result::Result<Inode, Checked<E>> {
        let mut w = self.wtx().await?;
        let mut refused = None;
        let r = self
            .mkdir_checked_in(&mut w, path, parents, |chain, missing| {
                keep_refusal(&mut refused, authorize(chain, missing))
            })
            .await;
        checked(self.done(w, r).await, refused)
    }

    async fn mkdir_checked_in(
        &self,
        w: &mut WTx,
        path: &str,
        parents: bool,
        authorize: impl FnOnce(&[Inode], usize) -> Result<NewEntry>,
    ) -> Result<Inode> {
        let norm = normalize(path)?;
        let parts: Vec<&str> = norm.split('/').filter(|p| !p.is_empty()).collect();
        let mut chain = self
            .chain_on(&mut w.tx, &norm, Scope::Write(&w.touched))
            .await?;
        let missing = parts.len() + 1 - chain.len();
        let e = authorize(&chain, missing)?;
        let mut cur = chain.pop().expect("root");
        if missing == 0 {
            return if parents && cur.kind == Kind::Dir {
                Ok(cur)
            } else {
                Err(CatalogError::Exists(norm))
            };
        }
        let first_missing = parts.len() - missing;
        if missing > 1 && !parents {
            let so_far = format!("/{}", parts[..=first_missing].join("/"));
            return Err(CatalogError::NotFound(so_far));
        }
        for part in &parts[first_missing..] {
            cur = Self::insert(w, cur.id, part, Kind::Dir, &e).await?;
        }
        Ok(cur)
    }

    /// Starts a file at `path`: a pending entry, invisible until committed. An existing file at
    /// the path stays visible until the commit replaces it.
    pub async fn create_pending(&self, path: &str, e: &NewEntry) -> Result<Inode> {
        let item = CreateItem {
            path: path.to_string(),
            entry: e.clone(),
            kind: CreateKind::Pending,
            private: false,
        };
        self.create_files(std::slice::from_ref(&item), true)
            .await?
            .pop()
            .expect("one result per item")
    }

    /// Creates many files in one transaction (one result per item, in order): pending files
    /// for data to follow, or empty files visible at once. Without `overwrite` an existing
    /// file is an error; a pending file of the same path always is (another writer).
    pub async fn create_files(
        &self,
        items: &[CreateItem],
        overwrite: bool,
    ) -> Result<Vec<Result<Inode>>> {
        let mut seen = HashSet::new();
        let mut w = self.wtx().await?;
        // Files of a batch mostly share their directory: resolve each once per transaction.
        let mut parents = HashMap::new();
        let mut out = Vec::with_capacity(items.len());
        let mut failed_db = None;
        for it in items {
            let r = match normalize(&it.path) {
                Ok(n) if !seen.insert(n.clone()) => {
                    Err(CatalogError::Invalid(format!("{n}: named twice")))
                }
                Ok(_) => self.create_one(&mut w, it, overwrite, &mut parents).await,
                Err(e) => Err(e),
            };
            if let Err(CatalogError::Database(d)) = &r {
                failed_db = Some(d.clone());
                break;
            }
            out.push(r);
        }
        if let Some(d) = failed_db {
            // A database error aborts the whole transaction (PostgreSQL refuses further
            // statements): undo it and do the items one by one, so only the bad one fails.
            self.done::<()>(w, Err(CatalogError::Database(d)))
                .await
                .ok();
            if items.len() == 1 {
                return Ok(vec![Err(CatalogError::Database(
                    "create failed; see the metadata server's log".into(),
                ))]);
            }
            let mut out = Vec::with_capacity(items.len());
            for it in items {
                let mut w = self.wtx().await?;
                let r = self
                    .create_one(&mut w, it, overwrite, &mut HashMap::new())
                    .await;
                let ok = r.is_ok();
                let r2 = self
                    .done(
                        w,
                        if ok {
                            Ok(())
                        } else {
                            Err(CatalogError::Invalid(String::new()))
                        },
                    )
                    .await;
                out.push(match (r, r2) {
                    (Ok(i), Ok(())) => Ok(i),
                    (Err(e), _) => Err(e),
                    (Ok(_), Err(e)) => Err(e),
                });
            }
            return Ok(out);
        }
        self.done(w, Ok(())).await?;
        self.note_created(out.iter().filter(|r| r.is_ok()).count() as u64);
        Ok(out)
    }

    async fn create_one(
        &self,
        w: &mut WTx,
        it: &CreateItem,
        overwrite: bool,
        parents: &mut HashMap<String, Inode>,
    ) -> Result<Inode> {
        let (parent, name) = parent_and_name(&it.path)?;
        let dir = match parents.get(&parent) {
            Some(d) => d.clone(),
            None => {
                let (d, _) = self
                    .parent_dir(&mut w.tx, &it.path, Scope::Write(&w.touched))
                    .await?;
                parents.insert(parent, d.clone());
                d
            }
        };
        let e = &it.entry;
        let now = now_ms();
        // One statement in the common case: insert unless the name is taken; only when it is
        // taken find out how.
        let inserted = match it.kind {
            CreateKind::Pending => {
                let q = format!(
                    "INSERT INTO inodes (parent, name, kind, owner, grp, mode, size, mtime_ns, checksum, ctime_ms, flags) \
                     SELECT $1, $2, 1, $3, $4, $5, 0, $6, '', $7, $10 WHERE NOT EXISTS \
                     (SELECT 1 FROM inodes WHERE parent = $8 AND name = $2 AND (kind = 0 OR $9 = 0)) \
                     ON CONFLICT (parent, name) DO NOTHING RETURNING {INODE_COLS}"
                );
                sqlx::query(&q)
                    .bind(-dir.id)
                    .bind(&name)
                    .bind(&e.owner)
                    .bind(&e.group)
                    .bind(e.mode as i64)
                    .bind(e.mtime_ns)
                    .bind(now)
                    .bind(dir.id)
                    .bind(overwrite as i64)
                    .bind(if it.private { FLAG_PRIVATE } else { 0 })
                    .fetch_optional(&mut *w.tx)
                    .await?
            }
            CreateKind::Empty => {
                let q = format!(
                    "INSERT INTO inodes (parent, name, kind, owner, grp, mode, size, mtime_ns, checksum, ctime_ms) \
                     VALUES ($1, $2, 1, $3, $4, $5, 0, $6, $7, $8) \
                     ON CONFLICT (parent, name) DO NOTHING RETURNING {INODE_COLS}"
                );
                sqlx::query(&q)
                    .bind(dir.id)
                    .bind(&name)
                    .bind(&e.owner)
                    .bind(&e.group)
                    .bind(e.mode as i64)
                    .bind(e.mtime_ns)
                    .bind(EMPTY_CHECKSUM)
                    .bind(now)
                    .fetch_optional(&mut *w.tx)
                    .await?
            }
        };
        if let Some(row) = inserted {
            let mut inode = inode_from(&row)?;
            inode.parent = dir.id;
            w.touch(dir.id, &name);
            return Ok(inode);
        }
        let shown = normalize(&it.path)?;
        match self
            .child(&mut w.tx, dir.id, &name, Scope::Write(&w.touched))
            .await?
        {
            Some(x) if x.kind == Kind::Dir => return Err(CatalogError::IsADirectory(shown)),
            Some(_) if !overwrite => return Err(CatalogError::Exists(shown)),
            Some(old) if it.kind == CreateKind::Empty => {
                // Replace the old file by an empty one.
                Self::bury(&mut w.tx, &[old.id]).await?;
                Self::delete_inode(w, &old).await?;
                let mut i = Self::insert(w, dir.id, &name, Kind::File, e).await?;
                let q =
                    format!("UPDATE inodes SET checksum = $1 WHERE id = $2 RETURNING {INODE_COLS}");
                let row = sqlx::query(&q)
                    .bind(EMPTY_CHECKSUM)
                    .bind(i.id)
                    .fetch_one(&mut *w.tx)
                    .await?;
                i = inode_from(&row)?;
                return Ok(i);
            }
            _ => {}
        }
        Err(CatalogError::Busy(shown))
    }

    async fn delete_inode(w: &mut WTx, i: &Inode) -> Result<()> {
        sqlx::query("DELETE FROM inodes WHERE id = $1")
            .bind(i.id)
            .execute(&mut *w.tx)
            .await?;
        if !i.pending {
            w.touch(i.parent, &i.name);
        }
        Ok(())
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
        self.write(async |w| self.commit_in(w, id, size, checksum, mtime_ns).await)
            .await
    }

    async fn commit_in(
        &self,
        w: &mut WTx,
        id: i64,
        size: u64,
        checksum: &str,
        mtime_ns: i64,
    ) -> Result<Inode> {
        let row = sqlx::query("SELECT parent, name FROM inodes WHERE id = $1")
            .bind(id)
            .fetch_optional(&mut *w.tx)
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
        if let Some(old) = self
            .child(&mut w.tx, -parent, &name, Scope::Write(&w.touched))
            .await?
        {
            if old.kind == Kind::Dir {
                return Err(CatalogError::IsADirectory(name));
            }
            Self::bury(&mut w.tx, &[old.id]).await?;
            Self::delete_inode(w, &old).await?;
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
            .fetch_one(&mut *w.tx)
            .await?;
        w.touch(-parent, &name);
        inode_from(&row)
    }

    /// Drops a pending file (its replicas become dead).
    pub async fn abort_pending(&self, id: i64) -> Result<()> {
        self.write(async |w| {
            let i = Self::by_id(&mut w.tx, id)
                .await?
                .ok_or_else(|| CatalogError::NotFound(format!("inode {id}")))?;
            if !i.pending {
                return Err(CatalogError::Invalid(format!("inode {id} is not pending")));
            }
            Self::bury(&mut w.tx, &[id]).await?;
            Self::delete_inode(w, &i).await
        })
        .await
    }

    /// Pending files started before `before_ms` (abandoned uploads).
    pub async fn stale_pending(&self, before_ms: i64, limit: u32) -> Result<Vec<i64>> {
        let rows = sqlx::query(
            "SELECT id FROM inodes WHERE parent < 0 AND ctime_ms < $1 ORDER BY ctime_ms LIMIT $2",
        )
        .bind(before_ms)
        .bind(limit as i64)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get::<i64, _>(0)?)).collect()
    }

    /// Moves the replicas of these inodes to the dead list.
    async fn bury(c: &mut AnyConnection, ids: &[i64]) -> Result<()> {
        let now = now_ms();
        for id in ids {
            sqlx::query(
                "INSERT INTO dead_replicas (inode, node, since_ms) SELECT inode, node, $2 FROM replicas WHERE inode = $1 \
                 ON CONFLICT (inode, node) DO NOTHING",
            )
            .bind(id)
            .bind(now)
            .execute(&mut *c)
            .await?;
            sqlx::query("DELETE FROM replicas WHERE inode = $1")
                .bind(id)
                .execute(&mut *c)
                .await?;
        }
        Ok(())
    }

    /// Renames or moves an entry. A file may replace a file; nothing replaces a directory.
    pub async fn rename(&self, from: &str, to: &str) -> Result<Inode> {
        self.write(async |w| self.rename_in(w, from, to).await)
            .await
    }

    /// [`Catalog::rename`] after `authorize` approved it on what the same transaction sees:
    /// the entries along `from` (root first, as far as they exist), along the parent
    /// directory of `to`, and the entry at `to` if there is one.
    pub async fn rename_checked<E>(
        &self,
        from: &str,
        to: &str,
        authorize: impl FnOnce(&[Inode], &[Inode], Option<&Inode>) -> std::result::Result<(), E>,
    ) -> std::result::Result<Inode, Checked<E>> {
        let mut refused = None;
        let r = self
            .write(async |w| {
                let from_chain = self
                    .chain_on(&mut w.tx, &normalize(from)?, Scope::Write(&w.touched))
                    .await?;
                let (to_parent, to_name) = parent_and_name(&normalize(to)?)?;
                let to_chain = self
                    .chain_on(&mut w.tx, &to_parent, Scope::Write(&w.touched))
                    .await?;
                let parent_exists =
                    to_chain.len() == to_parent.split('/').filter(|p| !p.is_empty()).count() + 1;
                let target = match to_chain.last() {
                    Some(d) if parent_exists && d.kind == Kind::Dir => {
                        self.child(&mut w.tx, d.id, &to_name, Scope::Write(&w.touched))
                            .await?
                    }
                    _ => None,
                };
                keep_refusal(
                    &mut refused,
                    authorize(&from_chain, &to_chain, target.as_ref()),
                )?;
                self.rename_in(w, from, to).await
            })
            .await;
        checked(r, refused)
    }

    async fn rename_in(&self, w: &mut WTx, from: &str, to: &str) -> Result<Inode> {
        {
            let src = self
                .resolve(&mut w.tx, from, Scope::Write(&w.touched))
                .await?
                .ok_or_else(|| CatalogError::NotFound(from.to_string()))?;
            if src.id == ROOT {
                return Err(CatalogError::Invalid("cannot move the root".into()));
            }
            let (dir, name) = self
                .parent_dir(&mut w.tx, to, Scope::Write(&w.touched))
                .await?;
            // A directory cannot move into itself or below itself.
            let mut up = dir.id;
            while up != 0 {
                if up == src.id {
                    return Err(CatalogError::Invalid(format!(
                        "cannot move {from} into itself"
                    )));
                }
                up = Self::by_id(&mut w.tx, up)
                    .await?
                    .map(|i| i.parent)
                    .filter(|p| *p != 0 && up != ROOT)
                    .unwrap_or(0);
            }
            if let Some(existing) = self
                .child(&mut w.tx, dir.id, &name, Scope::Write(&w.touched))
                .await?
            {
                if existing.id == src.id {
                    return Ok(src);
                }
                if existing.kind == Kind::Dir || src.kind == Kind::Dir {
                    return Err(CatalogError::Exists(normalize(to)?));
                }
                Self::bury(&mut w.tx, &[existing.id]).await?;
                Self::delete_inode(w, &existing).await?;
            }
            let q = format!(
                "UPDATE inodes SET parent = $1, name = $2 WHERE id = $3 RETURNING {INODE_COLS}"
            );
            let row = sqlx::query(&q)
                .bind(dir.id)
                .bind(&name)
                .bind(src.id)
                .fetch_one(&mut *w.tx)
                .await?;
            w.touch(src.parent, &src.name);
            w.touch(dir.id, &name);
            inode_from(&row)
        }
    }

    /// Removes a file or an empty directory; with `recursive` a whole tree. Returns the number
    /// of entries removed. Their replicas become dead.
    pub async fn remove(&self, path: &str, recursive: bool) -> Result<u64> {
        self.write(async |w| self.remove_in(w, path, recursive).await)
            .await
    }

    /// [`Catalog::remove`] after `authorize` approved it on what the same transaction sees:
    /// the entries along `path` (root first, as far as they exist) and, when a directory is
    /// removed with everything below it, every directory below it (path, entry).
    pub async fn remove_checked<E>(
        &self,
        path: &str,
        recursive: bool,
        authorize: impl FnOnce(&[Inode], &[(String, Inode)]) -> std::result::Result<(), E>,
    ) -> std::result::Result<u64, Checked<E>> {
        let mut refused = None;
        let r = self
            .write(async |w| {
                let norm = normalize(path)?;
                let chain = self
                    .chain_on(&mut w.tx, &norm, Scope::Write(&w.touched))
                    .await?;
                let exists = chain.len() == norm.split('/').filter(|p| !p.is_empty()).count() + 1;
                let below = match chain.last() {
                    Some(top) if exists && recursive && top.kind == Kind::Dir && top.id != ROOT => {
                        Self::dirs_below_on(&mut w.tx, top, &norm).await?
                    }
                    _ => Vec::new(),
                };
                keep_refusal(&mut refused, authorize(&chain, &below))?;
                self.remove_in(w, path, recursive).await
            })
            .await;
        checked(r, refused)
    }

    /// Every directory below directory `top` (at `base`, not included), with its path, parents
    /// first, in one query on connection `c` (a transaction's, for a check to see what the
    /// change it guards will see).
    async fn dirs_below_on(
        c: &mut AnyConnection,
        top: &Inode,
        base: &str,
    ) -> Result<Vec<(String, Inode)>> {
        let q = format!(
            "WITH RECURSIVE t(id) AS (SELECT $1 UNION ALL SELECT i.id FROM inodes i JOIN t ON i.parent = t.id WHERE i.kind = 0) \
             SELECT {INODE_COLS} FROM inodes WHERE id IN (SELECT id FROM t) AND id <> $1"
        );
        let rows = sqlx::query(&q).bind(top.id).fetch_all(&mut *c).await?;
        let dirs: Vec<Inode> = rows.iter().map(inode_from).collect::<Result<_>>()?;
        let by_id: HashMap<i64, &Inode> = dirs.iter().map(|d| (d.id, d)).collect();
        let path_of = |d: &Inode| {
            let mut names = vec![d.name.as_str()];
            let mut up = d.parent;
            while let Some(p) = by_id.get(&up) {
                names.push(p.name.as_str());
                up = p.parent;
            }
            names.reverse();
            join(base, &names.join("/"))
        };
        let mut out: Vec<(String, Inode)> = dirs.iter().map(|d| (path_of(d), d.clone())).collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }

    async fn remove_in(&self, w: &mut WTx, path: &str, recursive: bool) -> Result<u64> {
        {
            let target = self
                .resolve(&mut w.tx, path, Scope::Write(&w.touched))
                .await?
                .ok_or_else(|| CatalogError::NotFound(path.to_string()))?;
            if target.id == ROOT {
                return Err(CatalogError::Invalid("cannot remove the root".into()));
            }
            let ids: Vec<i64> = if target.kind == Kind::Dir {
                let rows = sqlx::query(
                    "WITH RECURSIVE t(id) AS (SELECT $1 UNION ALL SELECT i.id FROM inodes i JOIN t ON i.parent = t.id OR i.parent = -t.id) SELECT id FROM t",
                )
                .bind(target.id)
                .fetch_all(&mut *w.tx)
                .await?;
                let ids: Vec<i64> = rows
                    .iter()
                    .map(|r| r.try_get::<i64, _>(0))
                    .collect::<std::result::Result<_, _>>()?;
                if ids.len() > 1 && !recursive {
                    return Err(CatalogError::NotEmpty(normalize(path)?));
                }
                ids
            } else {
                vec![target.id]
            };
            Self::bury(&mut w.tx, &ids).await?;
            // Children first (the unique key does not care, but foreign keys of xattrs do).
            for id in ids.iter().rev() {
                sqlx::query("DELETE FROM inodes WHERE id = $1")
                    .bind(id)
                    .execute(&mut *w.tx)
                    .await?;
            }
            // Entries below the target are keyed by ids that no longer resolve.
            w.touch(target.parent, &target.name);
            Ok(ids.len() as u64)
        }
    }

    async fn update_attr(&self, path: &str, sql: &str, value: AttrValue<'_>) -> Result<Inode> {
        self.write(async |w| {
            let i = self
                .resolve(&mut w.tx, path, Scope::Write(&w.touched))
                .await?
                .ok_or_else(|| CatalogError::NotFound(path.to_string()))?;
            let q = format!("{sql} WHERE id = $2 RETURNING {INODE_COLS}");
            let query = match value {
                AttrValue::Int(v) => sqlx::query(&q).bind(v),
                AttrValue::Text(v) => sqlx::query(&q).bind(v.to_string()),
            };
            let row = query.bind(i.id).fetch_one(&mut *w.tx).await?;
            w.touch(i.parent, &i.name);
            inode_from(&row)
        })
        .await
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

    async fn resolve_existing(&self, c: &mut AnyConnection, path: &str) -> Result<Inode> {
        let scope = Scope::Read(self.read_scope());
        self.resolve(c, path, scope)
            .await?
            .ok_or_else(|| CatalogError::NotFound(path.to_string()))
    }

    pub async fn xattr_set(&self, path: &str, name: &str, value: &[u8]) -> Result<()> {
        if name.is_empty() || name.len() > 255 || value.len() > 64 * 1024 {
            return Err(CatalogError::Invalid(
                "xattr names are 1-255 bytes, values at most 64 KiB".into(),
            ));
        }
        self.write(async |w| {
            let i = self
                .resolve(&mut w.tx, path, Scope::Write(&w.touched))
                .await?
                .ok_or_else(|| CatalogError::NotFound(path.to_string()))?;
            sqlx::query(
                "INSERT INTO xattrs (inode, name, value) VALUES ($1, $2, $3) ON CONFLICT (inode, name) DO UPDATE SET value = excluded.value",
            )
            .bind(i.id)
            .bind(name)
            .bind(value.to_vec())
            .execute(&mut *w.tx)
            .await?;
            Ok(())
        })
        .await
    }

    pub async fn xattr_get(&self, path: &str, name: &str) -> Result<Option<Vec<u8>>> {
        let mut c = self.pool.acquire().await?;
        let i = self.resolve_existing(&mut c, path).await?;
        self.xattr_of(&mut c, i.id, name).await
    }

    async fn xattr_of(
        &self,
        c: &mut AnyConnection,
        inode: i64,
        name: &str,
    ) -> Result<Option<Vec<u8>>> {
        let row = sqlx::query("SELECT value FROM xattrs WHERE inode = $1 AND name = $2")
            .bind(inode)
            .bind(name)
            .fetch_optional(&mut *c)
            .await?;
        Ok(row.map(|r| r.try_get::<Vec<u8>, _>(0)).transpose()?)
    }

    /// An attribute of an entry by id.
    pub async fn xattr_by_id(&self, inode: i64, name: &str) -> Result<Option<Vec<u8>>> {
        let mut c = self.pool.acquire().await?;
        self.xattr_of(&mut c, inode, name).await
    }

    /// Every entry (id) that carries attribute `name`, with its value.
    pub async fn with_xattr(&self, name: &str) -> Result<Vec<(i64, Vec<u8>)>> {
        let rows = sqlx::query("SELECT inode, value FROM xattrs WHERE name = $1 ORDER BY inode")
            .bind(name)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get::<Vec<u8>, _>(1)?)))
            .collect()
    }

    pub async fn xattr_list(&self, path: &str) -> Result<Vec<(String, Vec<u8>)>> {
        let mut c = self.pool.acquire().await?;
        let i = self.resolve_existing(&mut c, path).await?;
        let rows = sqlx::query("SELECT name, value FROM xattrs WHERE inode = $1 ORDER BY name")
            .bind(i.id)
            .fetch_all(&mut *c)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<Vec<u8>, _>(1)?)))
            .collect()
    }

    pub async fn xattr_remove(&self, path: &str, name: &str) -> Result<bool> {
        self.write(async |w| {
            let i = self
                .resolve(&mut w.tx, path, Scope::Write(&w.touched))
                .await?
                .ok_or_else(|| CatalogError::NotFound(path.to_string()))?;
            let done = sqlx::query("DELETE FROM xattrs WHERE inode = $1 AND name = $2")
                .bind(i.id)
                .bind(name)
                .execute(&mut *w.tx)
                .await?;
            Ok(done.rows_affected() > 0)
        })
        .await
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
        self.write(async |w| Self::upsert_replica(&mut w.tx, inode, node, state, checksum).await)
            .await
    }

    async fn upsert_replica(
        c: &mut AnyConnection,
        inode: i64,
        node: &str,
        state: ReplicaState,
        checksum: &str,
    ) -> Result<()> {
        sqlx::query(
            "INSERT INTO replicas (inode, node, state, checksum, updated_ms, created_ms) VALUES ($1, $2, $3, $4, $5, $5) \
             ON CONFLICT (inode, node) DO UPDATE SET state = excluded.state, checksum = excluded.checksum, updated_ms = excluded.updated_ms",
        )
        .bind(inode)
        .bind(node)
        .bind(state.to_i64())
        .bind(checksum)
        .bind(now_ms())
        .execute(&mut *c)
        .await
        .map_err(|e| match e {
            sqlx::Error::Database(d) if d.message().to_ascii_lowercase().contains("foreign key") => {
                CatalogError::NotFound(format!("inode {inode} or node {node}"))
            }
                        other => other.into(),
        })?;
        // A new copy on a node that was told to delete an older one must not be deleted.
        sqlx::query("DELETE FROM dead_replicas WHERE inode = $1 AND node = $2")
            .bind(inode)
            .bind(node)
            .execute(&mut *c)
            .await?;
        Ok(())
    }

    /// Records replicas being written (one transaction for all), except where the node
    /// already holds a complete replica of the file: those pairs are returned, and no write
    /// may be granted for them (a complete replica is never written over). `lease_ms` is
    /// when the rows expire unless [`Catalog::renew_writing`] extends them (0: never, for
    /// uploads: their rows go with their pending file).
    pub async fn start_replicas(
        &self,
        replicas: &[(i64, String)],
        lease_ms: i64,
    ) -> Result<Vec<(i64, String)>> {
        self.write(async |w| {
            let mut complete = Vec::new();
            for (inode, node) in replicas {
                let state =
                    sqlx::query("SELECT state FROM replicas WHERE inode = $1 AND node = $2")
                        .bind(inode)
                        .bind(node)
                        .fetch_optional(&mut *w.tx)
                        .await?
                        .map(|r| r.try_get::<i64, _>(0))
                        .transpose()?;
                if state == Some(ReplicaState::Complete.to_i64()) {
                    complete.push((*inode, node.clone()));
                    continue;
                }
                Self::upsert_replica(&mut w.tx, *inode, node, ReplicaState::Writing, "").await?;
                sqlx::query("UPDATE replicas SET lease_ms = $1 WHERE inode = $2 AND node = $3")
                    .bind(lease_ms)
                    .bind(inode)
                    .bind(node)
                    .execute(&mut *w.tx)
                    .await?;
            }
            Ok(complete)
        })
        .await
    }

    /// Extends the lease of replicas still being written (a running session's).
    pub async fn renew_writing(&self, replicas: &[(i64, String)], lease_ms: i64) -> Result<()> {
        self.write(async |w| {
            for (inode, node) in replicas {
                sqlx::query(
                    "UPDATE replicas SET lease_ms = $1 WHERE inode = $2 AND node = $3 AND state = $4",
                )
                .bind(lease_ms)
                .bind(inode)
                .bind(node)
                .bind(ReplicaState::Writing.to_i64())
                .execute(&mut *w.tx)
                .await?;
            }
            Ok(())
        })
        .await
    }

    /// Drops replicas of committed files still being written whose lease ended before
    /// `before_ms` (their session died, e.g. with its metadata server), or that have no lease
    /// at all (left by a version without leases); only on `node` if given. Returns them.
    /// Uploads' rows (of pending files) are not touched: they go with their file.
    pub async fn expire_writing(
        &self,
        before_ms: i64,
        node: Option<&str>,
    ) -> Result<Vec<(i64, String)>> {
        self.write(async |w| {
            let rows = sqlx::query(
                "DELETE FROM replicas WHERE state = $1 AND lease_ms < $2 AND ($3 = '' OR node = $3) \
                 AND inode IN (SELECT id FROM inodes WHERE parent > 0) RETURNING inode, node",
            )
            .bind(ReplicaState::Writing.to_i64())
            .bind(before_ms)
            .bind(node.unwrap_or(""))
            .fetch_all(&mut *w.tx)
            .await?;
            rows.iter()
                .map(|r| Ok((r.try_get::<i64, _>(0)?, r.try_get::<String, _>(1)?)))
                .collect::<Result<Vec<_>>>()
        })
        .await
    }

    /// Sets the state of existing replicas (`(inode, node)` pairs) in one transaction.
    pub async fn mark_replicas(&self, which: &[(i64, String)], state: ReplicaState) -> Result<()> {
        self.write(async |w| {
            for (inode, node) in which {
                sqlx::query("UPDATE replicas SET state = $1, updated_ms = $2 WHERE inode = $3 AND node = $4")
                    .bind(state.to_i64())
                    .bind(now_ms())
                    .bind(inode)
                    .bind(node)
                    .execute(&mut *w.tx)
                    .await?;
            }
            Ok(())
        })
        .await
    }

    /// Marks a replica complete and, if its file is still pending, commits the file: one
    /// transaction, so a file becomes visible exactly when its first verified copy exists.
    /// A replica of a committed file must have its size and checksum.
    pub async fn complete_replica(
        &self,
        inode: i64,
        node: &str,
        size: u64,
        checksum: &str,
        mtime_ns: i64,
    ) -> Result<Inode> {
        self.write(async |w| {
            self.complete_replica_in(w, inode, node, size, checksum, mtime_ns)
                .await
        })
        .await
    }

    /// [`Catalog::complete_replica`] for many replicas of one node in one transaction (group
    /// commit: a node receiving many small files reports them together). Each replica gets
    /// its own result; one that fails is rolled back to a savepoint and changes nothing,
    /// while the others commit.
    pub async fn complete_replicas(
        &self,
        node: &str,
        written: &[WrittenReplica],
    ) -> Result<Vec<Result<Inode>>> {
        self.write(async |w| {
            let mut out = Vec::with_capacity(written.len());
            for r in written {
                sqlx::query("SAVEPOINT replica").execute(&mut *w.tx).await?;
                let one = self
                    .complete_replica_in(w, r.inode, node, r.size, &r.checksum, r.mtime_ns)
                    .await;
                if one.is_err() {
                    sqlx::query("ROLLBACK TO SAVEPOINT replica")
                        .execute(&mut *w.tx)
                        .await?;
                }
                // (Released either way: a rolled-back savepoint stays open until released,
                // and the next replica's would nest in it.)
                sqlx::query("RELEASE SAVEPOINT replica")
                    .execute(&mut *w.tx)
                    .await?;
                out.push(one);
            }
            Ok(out)
        })
        .await
    }

    async fn complete_replica_in(
        &self,
        w: &mut WTx,
        inode: i64,
        node: &str,
        size: u64,
        checksum: &str,
        mtime_ns: i64,
    ) -> Result<Inode> {
        let i = Self::by_id(&mut w.tx, inode)
            .await?
            .ok_or_else(|| CatalogError::NotFound(format!("inode {inode}")))?;
        if !i.pending && (i.size != size || !checksums_agree(&i.checksum, checksum)) {
            return Err(CatalogError::Invalid(format!(
                "replica of inode {inode} on {node} does not match the file (size {size}, checksum {checksum}; the file has size {}, checksum {})",
                i.size, i.checksum
            )));
        }
        // Only a replica the catalog expects (one being written there) completes; the
        // report of one already complete (a retry) changes nothing.
        let state = sqlx::query("SELECT state FROM replicas WHERE inode = $1 AND node = $2")
            .bind(inode)
            .bind(node)
            .fetch_optional(&mut *w.tx)
            .await?
            .map(|r| r.try_get::<i64, _>(0))
            .transpose()?
            .map(ReplicaState::from_i64);
        match state {
            Some(ReplicaState::Writing) => {}
            Some(ReplicaState::Complete) if !i.pending => return Ok(i),
            _ => {
                return Err(CatalogError::Denied(format!(
                    "no replica of inode {inode} is being written on {node}"
                )));
            }
        }
        Self::upsert_replica(&mut w.tx, inode, node, ReplicaState::Complete, checksum).await?;
        if i.pending {
            self.commit_in(w, inode, size, checksum, mtime_ns).await
        } else {
            Ok(i)
        }
    }

    pub async fn replicas(&self, inode: i64) -> Result<Vec<Replica>> {
        let rows = sqlx::query("SELECT inode, node, state, checksum, updated_ms, created_ms FROM replicas WHERE inode = $1 ORDER BY node")
            .bind(inode)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(replica_from).collect()
    }

    /// Replicas of many files (missing ids map to no replicas).
    pub async fn replicas_of(&self, inodes: &[i64]) -> Result<HashMap<i64, Vec<Replica>>> {
        let mut out: HashMap<i64, Vec<Replica>> = HashMap::new();
        for chunk in inodes.chunks(500) {
            let list = chunk
                .iter()
                .map(|i| i.to_string())
                .collect::<Vec<_>>()
                .join(",");
            // Ids are integers: formatting them into the statement is safe and lets one query
            // serve a whole batch on both backends.
            let q = format!(
                "SELECT inode, node, state, checksum, updated_ms, created_ms FROM replicas WHERE inode IN ({list}) ORDER BY inode, node"
            );
            for r in sqlx::query(&q).fetch_all(&self.pool).await? {
                let r = replica_from(&r)?;
                out.entry(r.inode).or_default().push(r);
            }
        }
        Ok(out)
    }

    /// Every replica a node is supposed to hold.
    pub async fn node_replicas(&self, node: &str) -> Result<Vec<Replica>> {
        let rows = sqlx::query("SELECT inode, node, state, checksum, updated_ms, created_ms FROM replicas WHERE node = $1 ORDER BY inode")
            .bind(node)
            .fetch_all(&self.pool)
            .await?;
        rows.iter().map(replica_from).collect()
    }

    /// Number of replicas per node and state: `(node, state, count)`.
    pub async fn replica_counts(&self) -> Result<Vec<(String, ReplicaState, u64)>> {
        let rows = sqlx::query(
            "SELECT node, state, COUNT(*) FROM replicas GROUP BY node, state ORDER BY node",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<String, _>(0)?,
                    ReplicaState::from_i64(r.try_get(1)?),
                    r.try_get::<i64, _>(2)? as u64,
                ))
            })
            .collect()
    }

    /// Drops a replica record (its file goes on the node's dead list for removal).
    pub async fn remove_replica(&self, inode: i64, node: &str) -> Result<()> {
        self.remove_replicas(&[(inode, node.to_string())]).await
    }

    /// Drops replica records (`(inode, node)` pairs) in one transaction: their files go on
    /// their nodes' dead lists for removal.
    pub async fn remove_replicas(&self, which: &[(i64, String)]) -> Result<()> {
        self.write(async |w| {
            for (inode, node) in which {
                Self::bury_replica(w, *inode, node).await?;
            }
            Ok(())
        })
        .await
    }

    async fn bury_replica(w: &mut WTx, inode: i64, node: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO dead_replicas (inode, node, since_ms) VALUES ($1, $2, $3) ON CONFLICT (inode, node) DO NOTHING",
        )
        .bind(inode)
        .bind(node)
        .bind(now_ms())
        .execute(&mut *w.tx)
        .await?;
        sqlx::query("DELETE FROM replicas WHERE inode = $1 AND node = $2")
            .bind(inode)
            .bind(node)
            .execute(&mut *w.tx)
            .await?;
        Ok(())
    }

    /// Files a node should remove now (dead replicas whose time has come).
    pub async fn dead_replicas(&self, node: &str) -> Result<Vec<i64>> {
        let rows = sqlx::query(
            "SELECT inode FROM dead_replicas WHERE node = $1 AND since_ms <= $2 ORDER BY inode LIMIT 10000",
        )
        .bind(node)
        .bind(now_ms())
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(|r| Ok(r.try_get::<i64, _>(0)?)).collect()
    }

    /// A node removed these files.
    pub async fn forget_dead(&self, node: &str, inodes: &[i64]) -> Result<()> {
        self.write(async |w| {
            for i in inodes {
                sqlx::query("DELETE FROM dead_replicas WHERE inode = $1 AND node = $2")
                    .bind(i)
                    .bind(node)
                    .execute(&mut *w.tx)
                    .await?;
            }
            Ok(())
        })
        .await
    }

    /// Whether an inode exists at all (committed or pending).
    pub async fn exists(&self, inode: i64) -> Result<bool> {
        let row = sqlx::query("SELECT 1 FROM inodes WHERE id = $1")
            .bind(inode)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// Compares a node's inventory (`file id -> size`) with the catalog: replicas it lacks
    /// become missing, replicas of the wrong size damaged (missing and damaged ones it holds
    /// again, correctly, become complete), and files the catalog does not expect on it go on
    /// its dead list, to be removed after `grace_ms` (a file may be between its local commit
    /// and its report).
    pub async fn reconcile(
        &self,
        node: &str,
        held: &HashMap<i64, u64>,
        grace_ms: i64,
    ) -> Result<Reconciled> {
        // Copies to this node whose session died are not being written: forget them, so a
        // file the node holds for one counts as unknown (removed after the grace period).
        self.expire_writing(now_ms(), Some(node)).await?;
        let rows = sqlx::query(
            "SELECT r.inode, r.state, i.size, i.parent FROM replicas r JOIN inodes i ON i.id = r.inode WHERE r.node = $1",
        )
        .bind(node)
        .fetch_all(&self.pool)
        .await?;
        let mut out = Reconciled::default();
        let mut expected: HashSet<i64> = HashSet::with_capacity(rows.len());
        let mut restored = Vec::new();
        for r in &rows {
            let inode: i64 = r.try_get(0)?;
            let state = ReplicaState::from_i64(r.try_get(1)?);
            let size = r.try_get::<i64, _>(2)? as u64;
            let pending = r.try_get::<i64, _>(3)? < 0;
            expected.insert(inode);
            match held.get(&inode) {
                // Being written, or its file is still pending: nothing to say yet.
                _ if state == ReplicaState::Writing || pending => {}
                None if state != ReplicaState::Missing => out.missing.push(inode),
                None => {}
                Some(s) if *s != size && state != ReplicaState::Damaged => out.damaged.push(inode),
                Some(s) if *s == size && state == ReplicaState::Missing => {
                    restored.push(inode);
                    out.known += 1;
                }
                Some(_) => out.known += 1,
            }
        }
        let dead: HashSet<i64> = {
            let rows = sqlx::query("SELECT inode FROM dead_replicas WHERE node = $1")
                .bind(node)
                .fetch_all(&self.pool)
                .await?;
            rows.iter()
                .map(|r| r.try_get::<i64, _>(0))
                .collect::<std::result::Result<_, _>>()?
        };
        out.orphans = held
            .keys()
            .filter(|i| !expected.contains(i) && !dead.contains(i))
            .copied()
            .collect();
        out.orphans.sort_unstable();
        out.missing.sort_unstable();
        out.damaged.sort_unstable();
        self.write(async |w| {
            let now = now_ms();
            for (ids, state) in [
                (&out.missing, ReplicaState::Missing),
                (&out.damaged, ReplicaState::Damaged),
                (&restored, ReplicaState::Complete),
            ] {
                for i in ids {
                    sqlx::query("UPDATE replicas SET state = $1, updated_ms = $2 WHERE inode = $3 AND node = $4")
                        .bind(state.to_i64())
                        .bind(now)
                        .bind(i)
                        .bind(node)
                        .execute(&mut *w.tx)
                        .await?;
                }
            }
            for i in &out.orphans {
                sqlx::query(
                    "INSERT INTO dead_replicas (inode, node, since_ms) VALUES ($1, $2, $3) ON CONFLICT (inode, node) DO NOTHING",
                )
                .bind(i)
                .bind(node)
                .bind(now + grace_ms)
                .execute(&mut *w.tx)
                .await?;
            }
            Ok(())
        })
        .await?;
        Ok(out)
    }

    // ---- nodes -----------------------------------------------------------------------

    /// Registers a node, or updates its site, address and capacity (no key, no certificate:
    /// for tests and tools).
    pub async fn register_node(
        &self,
        name: &str,
        site: &str,
        address: &str,
        capacity: u64,
        free: u64,
    ) -> Result<Node> {
        self.register_node_with_key(&NodeRegistration {
            name,
            site,
            address,
            capacity,
            free,
            new_key: &[],
            cert: "",
            may_rotate: false,
        })
        .await
        .map(|(n, _)| n)
    }

    /// Registers a node with its certificate, returning the node and the key its capabilities
    /// are signed with. A node's key goes only to registrations with the certificate recorded
    /// with it: the first registration records `cert` and `new_key`; the same certificate gets
    /// the same key again (restarts keep capabilities valid); another certificate is refused
    /// ([`CatalogError::Denied`]) unless `may_rotate` (the enrolment lists it), and then it is
    /// recorded with `new_key`, so an existing key is never handed to a new certificate. A
    /// node registered before certificates were recorded gets `new_key` too.
    pub async fn register_node_with_key(
        &self,
        r: &NodeRegistration<'_>,
    ) -> Result<(Node, Vec<u8>)> {
        let now = now_ms();
        let mut w = self.wtx().await?;
        let res = async {
            let row = sqlx::query("SELECT cap_key, cert_fp FROM nodes WHERE name = $1")
                .bind(r.name)
                .fetch_optional(&mut *w.tx)
                .await?;
            let (key, fp): (Vec<u8>, String) = match &row {
                Some(row) => (row.try_get(0)?, row.try_get(1)?),
                None => (Vec::new(), String::new()),
            };
            let same = !key.is_empty() && !fp.is_empty() && fp == r.cert;
            let (key, fp) = if r.new_key.is_empty() || same {
                (key, fp)
            } else if key.is_empty() || fp.is_empty() || r.may_rotate {
                // The first keyed registration; or one from before certificates were
                // recorded (that key may have gone to anyone: a new one); or the enrolment
                // lists this new certificate.
                (r.new_key.to_vec(), r.cert.to_string())
            } else {
                return Err(CatalogError::Denied(format!(
                    "node {} is registered with certificate {fp}, not {}",
                    r.name, r.cert
                )));
            };
            sqlx::query(
                "INSERT INTO nodes (name, site, address, capacity, free, load, heartbeat_ms, registered_ms, up, cap_key, cert_fp) \
                 VALUES ($1, $2, $3, $4, $5, 0.0, $6, $6, 1, $7, $8) \
                 ON CONFLICT (name) DO UPDATE SET site = excluded.site, address = excluded.address, capacity = excluded.capacity, \
                 free = excluded.free, heartbeat_ms = excluded.heartbeat_ms, registered_ms = excluded.registered_ms, up = 1, \
                 cap_key = excluded.cap_key, cert_fp = excluded.cert_fp",
            )
            .bind(r.name)
            .bind(r.site)
            .bind(r.address)
            .bind(r.capacity as i64)
            .bind(r.free as i64)
            .bind(now)
            .bind(key.clone())
            .bind(fp)
            .execute(&mut *w.tx)
            .await?;
            Ok(key)
        }
        .await;
        let key = self.done(w, res).await?;
        Ok((self.node(r.name).await?, key))
    }

    /// The capability keys of all nodes.
    pub async fn node_keys(&self) -> Result<HashMap<String, Vec<u8>>> {
        let rows = sqlx::query("SELECT name, cap_key FROM nodes")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((r.try_get::<String, _>(0)?, r.try_get::<Vec<u8>, _>(1)?)))
            .collect()
    }

    /// The certificate fingerprint each node registered with (`sha256:...`; empty for a node
    /// registered before fingerprints were recorded).
    pub async fn node_certs(&self) -> Result<HashMap<String, String>> {
        let rows = sqlx::query("SELECT name, cert_fp FROM nodes")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<String, _>(0)?,
                    r.try_get::<Option<String>, _>(1)?.unwrap_or_default(),
                ))
            })
            .collect()
    }

    pub async fn heartbeat(&self, name: &str, capacity: u64, free: u64, load: f64) -> Result<Node> {
        self.write(async |w| {
            let done = sqlx::query("UPDATE nodes SET capacity = $1, free = $2, load = $3, heartbeat_ms = $4, up = 1 WHERE name = $5")
                .bind(capacity as i64)
                .bind(free as i64)
                .bind(load)
                .bind(now_ms())
                .bind(name)
                .execute(&mut *w.tx)
                .await?;
            if done.rows_affected() == 0 {
                return Err(CatalogError::NotFound(format!("node {name}")));
            }
            Ok(())
        })
        .await?;
        self.node(name).await
    }

    pub async fn node(&self, name: &str) -> Result<Node> {
        let row = sqlx::query(
            "SELECT name, site, address, capacity, free, load, heartbeat_ms, registered_ms, up, drain_ms, drain_replicas FROM nodes WHERE name = $1",
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
            "SELECT name, site, address, capacity, free, load, heartbeat_ms, registered_ms, up, drain_ms, drain_replicas FROM nodes ORDER BY site, name",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(node_from).collect()
    }

    /// Marks nodes whose last heartbeat is older than `max_age_ms` as down; returns them.
    pub async fn expire_nodes(&self, max_age_ms: i64) -> Result<Vec<String>> {
        let cutoff = now_ms() - max_age_ms;
        self.write(async |w| {
            let rows = sqlx::query(
                "UPDATE nodes SET up = 0 WHERE up = 1 AND heartbeat_ms < $1 RETURNING name",
            )
            .bind(cutoff)
            .fetch_all(&mut *w.tx)
            .await?;
            rows.iter()
                .map(|r| Ok(r.try_get::<String, _>(0)?))
                .collect::<Result<Vec<String>>>()
        })
        .await
    }

    /// Removes a node from the registry (it must hold no replicas).
    pub async fn remove_node(&self, name: &str) -> Result<()> {
        self.write(async |w| {
            let n: i64 = sqlx::query("SELECT COUNT(*) FROM replicas WHERE node = $1")
                .bind(name)
                .fetch_one(&mut *w.tx)
                .await?
                .try_get(0)?;
            if n > 0 {
                return Err(CatalogError::NotEmpty(format!(
                    "node {name} ({n} replicas)"
                )));
            }
            sqlx::query("DELETE FROM dead_replicas WHERE node = $1")
                .bind(name)
                .execute(&mut *w.tx)
                .await?;
            sqlx::query("DELETE FROM nodes WHERE name = $1")
                .bind(name)
                .execute(&mut *w.tx)
                .await?;
            Ok(())
        })
        .await
    }

    /// Starts (`on`) or ends the drain of a node. Starting records the time and the complete
    /// replicas it holds; starting again keeps both (the drain goes on from where it is).
    pub async fn set_drain(&self, name: &str, on: bool) -> Result<Node> {
        self.write(async |w| {
            let done = if on {
                sqlx::query(
                    "UPDATE nodes SET drain_replicas = CASE WHEN drain_ms = 0 THEN \
                     (SELECT COUNT(*) FROM replicas WHERE node = $1 AND state = $2) ELSE drain_replicas END, \
                     drain_ms = CASE WHEN drain_ms = 0 THEN $3 ELSE drain_ms END WHERE name = $1",
                )
                .bind(name)
                .bind(ReplicaState::Complete.to_i64())
                .bind(now_ms())
                .execute(&mut *w.tx)
                .await?
            } else {
                sqlx::query("UPDATE nodes SET drain_ms = 0, drain_replicas = 0 WHERE name = $1")
                    .bind(name)
                    .execute(&mut *w.tx)
                    .await?
            };
            if done.rows_affected() == 0 {
                return Err(CatalogError::NotFound(format!("node {name}")));
            }
            Ok(())
        })
        .await?;
        self.node(name).await
    }

    /// Removes a node that still holds replicas (a dead one: its disk is gone). Its replica
    /// records go (the files stay in the namespace); returns what was lost: the records, and
    /// the files (non-empty) left without a complete replica anywhere else.
    pub async fn remove_node_forced(&self, name: &str) -> Result<ForcedRemoval> {
        self.write(async |w| {
            let known = sqlx::query("SELECT 1 FROM nodes WHERE name = $1")
                .bind(name)
                .fetch_optional(&mut *w.tx)
                .await?;
            if known.is_none() {
                return Err(CatalogError::NotFound(format!("node {name}")));
            }
            let replicas: i64 = sqlx::query("SELECT COUNT(*) FROM replicas WHERE node = $1")
                .bind(name)
                .fetch_one(&mut *w.tx)
                .await?
                .try_get(0)?;
            let rows = sqlx::query(
                "SELECT r.inode FROM replicas r JOIN inodes i ON i.id = r.inode \
                 WHERE r.node = $1 AND i.size > 0 AND NOT EXISTS \
                 (SELECT 1 FROM replicas o WHERE o.inode = r.inode AND o.node <> $1 AND o.state = $2) \
                 ORDER BY r.inode",
            )
            .bind(name)
            .bind(ReplicaState::Complete.to_i64())
            .fetch_all(&mut *w.tx)
            .await?;
            let orphaned = rows
                .iter()
                .map(|r| Ok(r.try_get::<i64, _>(0)?))
                .collect::<Result<Vec<i64>>>()?;
            for table in ["replicas", "dead_replicas", "nodes"] {
                let col = if table == "nodes" { "name" } else { "node" };
                sqlx::query(&format!("DELETE FROM {table} WHERE {col} = $1"))
                    .bind(name)
                    .execute(&mut *w.tx)
                    .await?;
            }
            Ok(ForcedRemoval {
                replicas: replicas as u64,
                orphaned,
            })
        })
        .await
    }

    /// Per node: complete replicas and the bytes they hold.
    pub async fn node_usage(&self) -> Result<HashMap<String, (u64, u64)>> {
        let rows = sqlx::query(
            "SELECT r.node, COUNT(*), CAST(COALESCE(SUM(i.size), 0) AS BIGINT) FROM replicas r \
             JOIN inodes i ON i.id = r.inode WHERE r.state = $1 GROUP BY r.node",
        )
        .bind(ReplicaState::Complete.to_i64())
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get::<String, _>(0)?,
                    (
                        r.try_get::<i64, _>(1)? as u64,
                        r.try_get::<i64, _>(2)? as u64,
                    ),
                ))
            })
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

fn chain_path(chain: &[Inode]) -> String {
    let names: Vec<&str> = chain.iter().skip(1).map(|i| i.name.as_str()).collect();
    format!("/{}", names.join("/"))
}

/// Whether two checksum lists agree on every algorithm both have (and share one).
pub fn checksums_agree(a: &str, b: &str) -> bool {
    let pairs = |s: &str| -> HashMap<String, String> {
        s.split_whitespace()
            .filter_map(|p| p.split_once(':'))
            .map(|(k, v)| (k.to_ascii_lowercase(), v.to_ascii_lowercase()))
            .collect()
    };
    let (a, b) = (pairs(a), pairs(b));
    let mut common = 0;
    for (k, v) in &a {
        if let Some(w) = b.get(k) {
            if v != w {
                return false;
            }
            common += 1;
        }
    }
    common > 0
}

fn replica_from(r: &AnyRow) -> Result<Replica> {
    Ok(Replica {
        inode: r.try_get("inode")?,
        node: r.try_get("node")?,
        state: ReplicaState::from_i64(r.try_get("state")?),
        checksum: r.try_get("checksum")?,
        updated_ms: r.try_get("updated_ms")?,
        created_ms: r.try_get("created_ms")?,
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
        drain_ms: r.try_get("drain_ms")?,
        drain_replicas: r.try_get::<i64, _>("drain_replicas")? as u64,
    })
}

/// Creates the file of a `sqlite:PATH` catalog readable by its owner only (it holds the nodes'
/// capability keys; SQLite gives the `-wal` and `-shm` files the same mode). An existing file
/// is left as it is (the metadata server tightens its data directory).
fn create_private(url: &str) -> Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let path = url
        .trim_start_matches("sqlite:")
        .trim_start_matches("//")
        .split('?')
        .next()
        .unwrap_or_default();
    if path.is_empty() || std::path::Path::new(path).exists() {
        return Ok(());
    }
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .mode(0o600)
        .open(path)
        .map(|_| ())
        .map_err(|e| CatalogError::Database(format!("cannot create {path}: {e}")))
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
