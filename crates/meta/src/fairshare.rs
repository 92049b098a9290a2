//! Which job's work goes next: priorities first, then fair share between groups and, within a
//! group, between its users. Pure (no I/O, no clock), so that the bound a late user waits can
//! be stated and tested here.
//!
//! Fair share is start-time fair queueing over files: each group and each user has a virtual
//! time, the files it was given divided by its weight; the next batch goes to the group with
//! the smallest, then to that group's user with the smallest. A group or user that becomes
//! active again starts at the smallest virtual time of those active (never below its own), so
//! idle time is not saved up to starve the others later, and a newcomer is not made to wait
//! behind what the others were given before it came.

use std::collections::{HashMap, HashSet};

/// One job's next batch, as the scheduler sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    pub job: i64,
    pub user: String,
    /// The user's primary group.
    pub group: String,
    /// 1 (lowest) .. 5 (highest).
    pub priority: u32,
    /// Files the batch would carry.
    pub files: u64,
}

/// Weights of users and groups (1 unless configured).
#[derive(Clone, Debug, Default)]
pub struct Weights {
    pub users: HashMap<String, f64>,
    pub groups: HashMap<String, f64>,
}

impl Weights {
    /// Parses `user:NAME=W` or `group:NAME=W` (W > 0).
    pub fn add(&mut self, spec: &str) -> Result<(), String> {
        let (who, w) = spec
            .split_once('=')
            .ok_or_else(|| format!("{spec:?}: expected user:NAME=WEIGHT or group:NAME=WEIGHT"))?;
        let w: f64 = w
            .trim()
            .parse()
            .ok()
            .filter(|w: &f64| w.is_finite() && *w > 0.0 && *w <= 1e6)
            .ok_or_else(|| format!("{spec:?}: the weight must be a number above 0"))?;
        match who.split_once(':') {
            Some(("user", n)) if !n.is_empty() => self.users.insert(n.to_string(), w),
            Some(("group", n)) if !n.is_empty() => self.groups.insert(n.to_string(), w),
            _ => {
                return Err(format!(
                    "{spec:?}: expected user:NAME=WEIGHT or group:NAME=WEIGHT"
                ));
            }
        };
        Ok(())
    }

    fn user(&self, u: &str) -> f64 {
        self.users.get(u).copied().unwrap_or(1.0)
    }

    fn group(&self, g: &str) -> f64 {
        self.groups.get(g).copied().unwrap_or(1.0)
    }
}

/// The scheduler's memory of what each group and user was given.
#[derive(Debug, Default)]
pub struct FairShare {
    pub weights: Weights,
    groups: HashMap<String, f64>,
    users: HashMap<String, f64>,
    /// Groups and users that had work at the last pick.
    active_groups: HashSet<String>,
    active_users: HashSet<String>,
}

impl FairShare {
    pub fn new(weights: Weights) -> Self {
        Self {
            weights,
            ..Default::default()
        }
    }

    /// The candidate whose batch goes next (`None` when there is none): the highest priority,
    /// then the group, then the user with the least virtual time, then the oldest job. Does
    /// not charge it: call [`Self::charge`] when the batch is launched. Call
    /// [`Self::activate`] first, once per scheduling pass, with every job that has work.
    pub fn pick<'a>(&self, candidates: &'a [Candidate]) -> Option<&'a Candidate> {
        let top = candidates.iter().map(|c| c.priority).max()?;
        let vt = |m: &HashMap<String, f64>, k: &str| m.get(k).copied().unwrap_or(0.0);
        candidates
            .iter()
            .filter(|c| c.priority == top)
            .min_by(|a, b| {
                let ga = vt(&self.groups, &a.group);
                let gb = vt(&self.groups, &b.group);
                let ua = vt(&self.users, &a.user);
                let ub = vt(&self.users, &b.user);
                ga.total_cmp(&gb)
                    .then(ua.total_cmp(&ub))
                    .then(a.job.cmp(&b.job))
            })
    }

    /// Counts `files` given to `c`'s user and group.
    pub fn charge(&mut self, c: &Candidate, files: u64) {
        let g = self.weights.group(&c.group);
        let u = self.weights.user(&c.user);
        *self.groups.entry(c.group.clone()).or_default() += files as f64 / g;
        *self.users.entry(c.user.clone()).or_default() += files as f64 / u;
    }

    /// Records which groups and users have work now (every job with runnable files, also
    /// those that cannot start a batch this pass): the newly active ones start at the least
    /// virtual time of those already active.
    pub fn activate(&mut self, candidates: &[Candidate]) {
        let groups: HashSet<String> = candidates.iter().map(|c| c.group.clone()).collect();
        let users: HashSet<String> = candidates.iter().map(|c| c.user.clone()).collect();
        catch_up(&mut self.groups, &self.active_groups, &groups);
        catch_up(&mut self.users, &self.active_users, &users);
        self.active_groups = groups;
        self.active_users = users;
    }
}

fn catch_up(vt: &mut HashMap<String, f64>, was: &HashSet<String>, now: &HashSet<String>) {
    let floor = now
        .iter()
        .filter(|k| was.contains(*k))
        .filter_map(|k| vt.get(k).copied())
        .min_by(f64::total_cmp);
    let Some(floor) = floor else { return };
    for k in now.iter().filter(|k| !was.contains(*k)) {
        let v = vt.entry(k.clone()).or_default();
        *v = v.max(floor);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(job: i64, user: &str, group: &str, priority: u32) -> Candidate {
        Candidate {
            job,
            user: user.into(),
            group: group.into(),
            priority,
            files: 10,
        }
    }

    /// Simulates `slots` batches in flight of `batch` files each, completing in launch order;
    /// user A has `a_files` queued from the start, B submits `b_files` after A's first
    /// `b_after` launches. Returns how many of A's batches were launched between B's
    /// submission and B's last launch.
    fn a_batches_while_b_waits(
        weights: Weights,
        a_files: u64,
        b_files: u64,
        b_after: usize,
        batch: u64,
    ) -> usize {
        let mut fs = FairShare::new(weights);
        let (mut a_left, mut b_left) = (a_files, 0u64);
        let mut launches = 0;
        let mut a_since_b = 0;
        loop {
            if launches == b_after {
                b_left = b_files;
            }
            let mut c = Vec::new();
            if a_left > 0 {
                c.push(cand(1, "ann", "atlas", 3));
            }
            if b_left > 0 {
                c.push(cand(2, "bob", "cms", 3));
            }
            fs.activate(&c);
            let Some(p) = fs.pick(&c).cloned() else {
                break;
            };
            launches += 1;
            let left = if p.user == "ann" {
                &mut a_left
            } else {
                &mut b_left
            };
            let n = batch.min(*left);
            *left -= n;
            fs.charge(&p, n);
            if p.user == "ann" && launches > b_after && b_files > 0 {
                a_since_b += 1;
            }
            if launches > b_after && b_left == 0 {
                return a_since_b;
            }
        }
        a_since_b
    }

    /// Issue 16's bound: user B's 10 files submitted after A's 10,000 at the same priority go
    /// out within ceil(10 / batch) of B's batches interleaved with at most as many of A's
    /// (equal weights), however long A ran before: B waits for at most
    /// 2 * ceil(10 / batch) launches, plus the batches already in flight when it came.
    #[test]
    fn a_late_user_waits_a_bounded_number_of_batches() {
        for b_after in [0, 1, 50, 900] {
            for batch in [1, 2, 5, 10] {
                let a = a_batches_while_b_waits(Weights::default(), 10_000, 10, b_after, batch);
                let b_batches = 10u64.div_ceil(batch) as usize;
                assert!(a <= b_batches, "after {b_after}, batch {batch}: A got {a}");
            }
        }
    }

    #[test]
    fn weights_share_in_proportion() {
        let mut w = Weights::default();
        w.add("user:bob=3").unwrap();
        let mut fs = FairShare::new(w);
        let c = vec![cand(1, "ann", "g", 3), cand(2, "bob", "g", 3)];
        let mut got = HashMap::<String, u32>::new();
        fs.activate(&c);
        for _ in 0..400 {
            let p = fs.pick(&c).unwrap().clone();
            fs.charge(&p, 1);
            *got.entry(p.user).or_default() += 1;
        }
        assert_eq!((got["ann"], got["bob"]), (100, 300));
        // Groups first: a group of two users gets as much as a group of one.
        let mut fs = FairShare::default();
        let c = vec![
            cand(1, "ann", "atlas", 3),
            cand(2, "al", "atlas", 3),
            cand(3, "bob", "cms", 3),
        ];
        let mut got = HashMap::<String, u32>::new();
        fs.activate(&c);
        for _ in 0..400 {
            let p = fs.pick(&c).unwrap().clone();
            fs.charge(&p, 1);
            *got.entry(p.group.clone()).or_default() += 1;
        }
        assert_eq!((got["atlas"], got["cms"]), (200, 200));
    }

    #[test]
    fn higher_priority_goes_first_and_idle_time_is_not_saved() {
        let mut fs = FairShare::default();
        let c = vec![cand(1, "ann", "g1", 3), cand(2, "bob", "g2", 5)];
        fs.activate(&c);
        assert_eq!(fs.pick(&c).unwrap().job, 2);
        // Ann alone for 1,000 batches; Bob comes back and gets no more than his share.
        let a = vec![cand(1, "ann", "g1", 3)];
        fs.activate(&a);
        for _ in 0..1000 {
            let p = fs.pick(&a).unwrap().clone();
            fs.charge(&p, 1);
        }
        let both = vec![cand(1, "ann", "g1", 3), cand(3, "bob", "g2", 3)];
        fs.activate(&both);
        let mut bob = 0;
        for _ in 0..100 {
            let p = fs.pick(&both).unwrap().clone();
            fs.charge(&p, 1);
            bob += (p.user == "bob") as u32;
        }
        assert!((49..=51).contains(&bob), "{bob}");
    }

    #[test]
    fn weights_parse() {
        let mut w = Weights::default();
        assert!(w.add("group:atlas=2.5").is_ok());
        for bad in [
            "atlas=2",
            "user:=1",
            "user:x=0",
            "user:x=-1",
            "user:x=nan",
            "user:x",
        ] {
            assert!(w.add(bad).is_err(), "{bad}");
        }
        assert_eq!(w.group("atlas"), 2.5);
    }
}
