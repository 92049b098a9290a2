//! Workloads generated from a fixed seed into tmpfs, smaller subsets of them for time-boxed
//! runs (hard links or prefix files, so they cost little memory), and the byte-for-byte
//! comparison of a destination with its source.

use std::fs;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use serde::Serialize;

pub const KIB: u64 = 1024;
pub const MIB: u64 = 1024 * KIB;
pub const GIB: u64 = 1024 * MIB;

/// xoshiro256** seeded through SplitMix64: fast, reproducible, good enough for test data.
pub struct Rng([u64; 4]);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        let mut x = seed;
        let mut next = || {
            x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut z = x;
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        };
        Rng([next(), next(), next(), next()])
    }

    pub fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let r = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        r
    }

    /// Uniform in [0, 1).
    pub fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Standard normal (Box-Muller).
    pub fn normal(&mut self) -> f64 {
        let u1 = self.unit().max(f64::MIN_POSITIVE);
        let u2 = self.unit();
        (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
    }

    pub fn fill(&mut self, buf: &mut [u8]) {
        for chunk in buf.chunks_mut(8) {
            let v = self.next_u64().to_le_bytes();
            chunk.copy_from_slice(&v[..chunk.len()]);
        }
    }
}

/// A source dataset on disk: one file, or a directory of files.
#[derive(Clone, Debug, Serialize)]
pub struct Dataset {
    /// "W1", "W2", "W3", or one of those with a subset suffix.
    pub id: String,
    /// The file, or the directory holding the files.
    pub root: PathBuf,
    pub tree: bool,
    /// Relative paths (for a tree) and sizes.
    #[serde(skip)]
    pub files: Vec<(PathBuf, u64)>,
    pub file_count: usize,
    pub bytes: u64,
}

impl Dataset {
    pub fn name(&self) -> String {
        self.root
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    }
}

/// Writes `size` pseudo-random bytes from `seed` to `path`.
pub fn write_file(path: &Path, size: u64, seed: u64) -> Result<()> {
    let mut rng = Rng::new(seed);
    let mut f = fs::File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut buf = vec![0u8; (4 * MIB).min(size.max(1)) as usize];
    let mut left = size;
    while left > 0 {
        let n = (buf.len() as u64).min(left) as usize;
        rng.fill(&mut buf[..n]);
        f.write_all(&buf[..n])
            .with_context(|| format!("writing {}", path.display()))?;
        left -= n as u64;
    }
    Ok(())
}

/// W1: one file of `size` bytes.
pub fn single(dir: &Path, id: &str, name: &str, size: u64, seed: u64) -> Result<Dataset> {
    fs::create_dir_all(dir)?;
    let root = dir.join(name);
    let ok = fs::metadata(&root)
        .map(|m| m.len() == size)
        .unwrap_or(false);
    if !ok {
        write_file(&root, size, seed)?;
    }
    Ok(Dataset {
        id: id.into(),
        root,
        tree: false,
        files: vec![(PathBuf::new(), size)],
        file_count: 1,
        bytes: size,
    })
}

/// W2 sizes: log-normal, median 15 MB, sigma 1.2, clipped to 100 kB..200 MB, drawn until the
/// next file would pass `target` bytes.
pub fn climate_sizes(target: u64, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    let (mu, sigma) = ((15e6f64).ln(), 1.2);
    let mut sizes = Vec::new();
    let mut total = 0;
    loop {
        let s = (mu + sigma * rng.normal()).exp().clamp(100e3, 200e6) as u64;
        if total + s > target {
            break;
        }
        total += s;
        sizes.push(s);
    }
    sizes
}

/// W3 sizes: `count` files, uniform 4..64 kB.
pub fn small_sizes(count: usize, seed: u64) -> Vec<u64> {
    let mut rng = Rng::new(seed);
    (0..count)
        .map(|_| 4 * KIB + rng.next_u64() % (60 * KIB + 1))
        .collect()
}

/// A directory of files with the given sizes, named `prefix00042.dat`.
pub fn tree(dir: &Path, id: &str, name: &str, sizes: &[u64], seed: u64) -> Result<Dataset> {
    let root = dir.join(name);
    let marker = dir.join(format!(".{name}.complete"));
    let mut files = Vec::new();
    let width = sizes.len().to_string().len().max(4);
    for (i, s) in sizes.iter().enumerate() {
        files.push((PathBuf::from(format!("f{i:0width$}.dat")), *s));
    }
    if !marker.exists() {
        let _ = fs::remove_dir_all(&root);
        fs::create_dir_all(&root)?;
        for (i, (rel, s)) in files.iter().enumerate() {
            write_file(&root.join(rel), *s, seed.wrapping_add(i as u64 * 7919))?;
        }
        fs::write(&marker, b"")?;
    }
    let bytes = sizes.iter().sum();
    Ok(Dataset {
        id: id.into(),
        root,
        tree: true,
        file_count: files.len(),
        files,
        bytes,
    })
}

/// A smaller version of `ds` for a time-boxed run: for a file, a new file of `max_bytes`
/// (rounded down to MiB); for a tree, hard links to the first files that fit in `max_bytes`
/// and `max_files` (at least one).
pub fn subset(ds: &Dataset, max_bytes: u64, max_files: usize, seed: u64) -> Result<Dataset> {
    if ds.bytes <= max_bytes && ds.file_count <= max_files {
        return Ok(ds.clone());
    }
    let dir = ds.root.parent().unwrap_or(Path::new("/"));
    if !ds.tree {
        let size = (max_bytes / MIB).max(1) * MIB;
        return single(
            dir,
            &format!("{}/{}", ds.id, human(size)),
            &format!("{}-{}M.bin", ds.name().trim_end_matches(".bin"), size / MIB),
            size,
            seed,
        );
    }
    let mut take = Vec::new();
    let mut total = 0;
    for (rel, s) in &ds.files {
        if !take.is_empty() && (total + s > max_bytes || take.len() >= max_files) {
            break;
        }
        total += s;
        take.push((rel.clone(), *s));
    }
    let name = format!("{}-first{}", ds.name(), take.len());
    let root = dir.join(&name);
    if !root.exists() {
        let tmp = dir.join(format!("{name}.tmp"));
        let _ = fs::remove_dir_all(&tmp);
        fs::create_dir_all(&tmp)?;
        for (rel, _) in &take {
            fs::hard_link(ds.root.join(rel), tmp.join(rel))?;
        }
        fs::rename(&tmp, &root)?;
    }
    Ok(Dataset {
        id: format!("{}/{} files", ds.id, take.len()),
        root,
        tree: true,
        file_count: take.len(),
        files: take,
        bytes: total,
    })
}

/// Compares what arrived under `dst_dir` with the source `ds`, byte for byte. The copy is
/// looked for at `dst_dir/<source name>` (how every tool here lands it).
pub fn verify(ds: &Dataset, dst_dir: &Path) -> Result<(), String> {
    let landed = dst_dir.join(ds.name());
    if !ds.tree {
        return same_file(&ds.root, &landed);
    }
    if !landed.is_dir() {
        return Err(format!("{} is missing", landed.display()));
    }
    for (rel, _) in &ds.files {
        same_file(&ds.root.join(rel), &landed.join(rel))?;
    }
    let mut found = 0;
    count_files(&landed, &mut found).map_err(|e| e.to_string())?;
    if found != ds.files.len() {
        return Err(format!(
            "{} holds {found} files, the source {}",
            landed.display(),
            ds.files.len()
        ));
    }
    Ok(())
}

fn count_files(dir: &Path, n: &mut usize) -> std::io::Result<()> {
    for e in fs::read_dir(dir)? {
        let e = e?;
        if e.file_type()?.is_dir() {
            count_files(&e.path(), n)?;
        } else {
            *n += 1;
        }
    }
    Ok(())
}

fn same_file(a: &Path, b: &Path) -> Result<(), String> {
    let open = |p: &Path| fs::File::open(p).map_err(|e| format!("{}: {e}", p.display()));
    let (mut fa, mut fb) = (open(a)?, open(b)?);
    let (la, lb) = (
        fa.metadata().map(|m| m.len()).unwrap_or(0),
        fb.metadata().map(|m| m.len()).unwrap_or(u64::MAX),
    );
    if la != lb {
        return Err(format!("{}: {lb} bytes, source has {la}", b.display()));
    }
    let mut ba = vec![0u8; 8 << 20];
    let mut bb = vec![0u8; 8 << 20];
    let mut off = 0u64;
    loop {
        let n = read_full(&mut fa, &mut ba).map_err(|e| e.to_string())?;
        let m = read_full(&mut fb, &mut bb[..n.max(1)]).map_err(|e| e.to_string())?;
        if n == 0 {
            return Ok(());
        }
        if n != m || ba[..n] != bb[..n] {
            return Err(format!(
                "{} differs from the source within bytes {off}..{}",
                b.display(),
                off + n as u64
            ));
        }
        off += n as u64;
    }
}

fn read_full(f: &mut fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        let n = f.read(&mut buf[got..])?;
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(got)
}

/// "4 GiB", "512 MiB", "68.1 MB" style sizes.
pub fn human(b: u64) -> String {
    if b >= GIB && b.is_multiple_of(GIB) {
        format!("{} GiB", b / GIB)
    } else if b >= MIB && b.is_multiple_of(MIB) {
        format!("{} MiB", b / MIB)
    } else if b >= GIB {
        format!("{:.2} GiB", b as f64 / GIB as f64)
    } else {
        format!("{:.1} MB", b as f64 / 1e6)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn climate_dataset_has_the_seed_002_shape() {
        let s = climate_sizes(2 * GIB, 5);
        let mut sorted = s.clone();
        sorted.sort();
        let median = sorted[sorted.len() / 2];
        let mean = s.iter().sum::<u64>() / s.len() as u64;
        assert!(
            (70..=75).contains(&s.len()),
            "{} files, median {median}, mean {mean}",
            s.len()
        );
        assert!((8_000_000..25_000_000).contains(&median), "median {median}");
        assert!(s.iter().all(|&x| (100_000..=200_000_000).contains(&x)));
    }

    #[test]
    fn small_files_average_about_34_kb() {
        let s = small_sizes(2000, 3);
        let total: u64 = s.iter().sum();
        assert!((60_000_000..76_000_000).contains(&total), "{total}");
    }

    #[test]
    fn rng_is_reproducible() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert_eq!(a.next_u64(), b.next_u64());
    }
}

#[cfg(test)]
mod verify_tests {
    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("haul-bench-test-{}-{name}", std::process::id()));
        let _ = fs::remove_dir_all(&d);
        fs::create_dir_all(&d).unwrap();
        d
    }

    fn copy_tree(from: &Path, to: &Path) {
        fs::create_dir_all(to).unwrap();
        for e in fs::read_dir(from).unwrap() {
            let e = e.unwrap();
            fs::copy(e.path(), to.join(e.file_name())).unwrap();
        }
    }

    #[test]
    fn a_wrong_byte_a_short_file_or_an_extra_file_fails_the_check() {
        let d = scratch("verify");
        let src = d.join("src");
        let ds = tree(&src, "W3", "w3", &small_sizes(20, 3), 300).unwrap();
        let dst = d.join("dst");
        copy_tree(&ds.root, &dst.join("w3"));
        assert_eq!(verify(&ds, &dst), Ok(()));

        let victim = dst.join("w3").join(&ds.files[7].0);
        let mut bytes = fs::read(&victim).unwrap();
        bytes[100] ^= 1;
        fs::write(&victim, &bytes).unwrap();
        assert!(verify(&ds, &dst).unwrap_err().contains("differs"));

        bytes[100] ^= 1;
        fs::write(&victim, &bytes[..bytes.len() - 1]).unwrap();
        assert!(verify(&ds, &dst).is_err());

        fs::write(&victim, &bytes).unwrap();
        fs::write(dst.join("w3").join("extra"), b"x").unwrap();
        assert!(verify(&ds, &dst).unwrap_err().contains("holds 21 files"));

        let one = single(&src, "W1", "one.bin", 3 * MIB + 5, 1).unwrap();
        assert!(verify(&one, &dst).is_err(), "missing file");
        fs::copy(&one.root, dst.join("one.bin")).unwrap();
        assert_eq!(verify(&one, &dst), Ok(()));
        let _ = fs::remove_dir_all(&d);
    }

    #[test]
    fn subsets_are_prefixes_of_the_tree_and_stated_in_the_id() {
        let d = scratch("subset");
        let ds = tree(&d, "W2", "w2", &[10, 20, 30, 40], 1).unwrap();
        let s = subset(&ds, 35, usize::MAX, 11).unwrap();
        assert_eq!(s.file_count, 2);
        assert_eq!(s.bytes, 30);
        assert!(s.id.contains("2 files"));
        let _ = fs::remove_dir_all(&d);
    }
}
