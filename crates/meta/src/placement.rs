//! Where new files go and which replica a reader uses. Writing: nodes of the client's own
//! site first (when it has one with room), then by free space and load; the files of one
//! request spread over the chosen nodes in proportion to what each can take, so a tree upload
//! uses several disks at once. Reading: complete replicas on live nodes, same site first, then
//! the node with the best measured delivery rate and lowest load. Pure functions.

use std::collections::HashMap;

/// A node as placement sees it.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeView {
    pub name: String,
    pub site: String,
    pub free: u64,
    pub capacity: u64,
    pub load: f64,
    pub up: bool,
    /// Being drained: takes no new files.
    pub draining: bool,
    /// Delivery rate recently measured for the node (bytes/s), 0 if unknown.
    pub rate: u64,
}

/// Space kept free on every node (and a fraction of its capacity), so that a node is never
/// filled to the last byte by placement estimates.
pub fn reserve(n: &NodeView) -> u64 {
    (64 << 20).max(n.capacity / 100)
}

/// Why no node could be chosen.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum PlaceError {
    #[error("no storage node is up and open for new files (the others are down or draining)")]
    NoNodes,
    #[error("no storage node has {need} bytes free (largest free space: {best} bytes)")]
    NoSpace { need: u64, best: u64 },
}

/// Chooses a node for each file (by size); returns indexes into `nodes`. Files are placed
/// largest first on the node that has the most room left relative to its size and load,
/// counting what this request has already put there.
pub fn place(
    sizes: &[u64],
    nodes: &[NodeView],
    client_site: Option<&str>,
) -> Result<Vec<usize>, PlaceError> {
    let up: Vec<usize> = (0..nodes.len())
        .filter(|i| nodes[*i].up && !nodes[*i].draining)
        .collect();
    if up.is_empty() {
        return Err(PlaceError::NoNodes);
    }
    let mut assigned: HashMap<usize, u64> = HashMap::new();
    let mut order: Vec<usize> = (0..sizes.len()).collect();
    order.sort_by(|a, b| sizes[*b].cmp(&sizes[*a]));
    let total: u64 = sizes.iter().sum();
    // The client's site takes the request if its nodes can hold all of it.
    let local: Vec<usize> = match client_site {
        Some(site) => up
            .iter()
            .copied()
            .filter(|i| nodes[*i].site == site)
            .collect(),
        None => Vec::new(),
    };
    let local_room: u64 = local
        .iter()
        .map(|i| nodes[*i].free.saturating_sub(reserve(&nodes[*i])))
        .sum();
    let pool = if !local.is_empty() && local_room >= total {
        local
    } else {
        up
    };
    // For balance each file weighs at least SPREAD bytes: a request of many small files is
    // spread over the nodes (parallel reads and computing later) instead of landing on the
    // one with the most room.
    const SPREAD: u64 = 64 << 20;
    let mut weight: HashMap<usize, u64> = HashMap::new();
    let mut out = vec![0usize; sizes.len()];
    for f in order {
        let need = sizes[f];
        let best = pool
            .iter()
            .copied()
            .filter(|i| {
                let room = nodes[*i]
                    .free
                    .saturating_sub(reserve(&nodes[*i]))
                    .saturating_sub(*assigned.get(i).unwrap_or(&0));
                room >= need
            })
            .max_by(|a, b| {
                let got = |i: &usize| *weight.get(i).unwrap_or(&0);
                score(&nodes[*a], got(a)).total_cmp(&score(&nodes[*b], got(b)))
            });
        let Some(b) = best else {
            let best_free = pool
                .iter()
                .map(|i| {
                    nodes[*i]
                        .free
                        .saturating_sub(reserve(&nodes[*i]))
                        .saturating_sub(*assigned.get(i).unwrap_or(&0))
                })
                .max()
                .unwrap_or(0);
            return Err(PlaceError::NoSpace {
                need,
                best: best_free,
            });
        };
        *assigned.entry(b).or_default() += need.max(1);
        *weight.entry(b).or_default() += need.max(SPREAD);
        out[f] = b;
    }
    Ok(out)
}

/// Higher is better: free space left after this request, discounted by load.
fn score(n: &NodeView, assigned: u64) -> f64 {
    let room = n.free.saturating_sub(assigned) as f64;
    room / (1.0 + n.load.max(0.0))
}

/// Orders replica holders for a reader: live nodes only; the reader's site first; then the
/// best measured rate, then the lowest load, then the name (stable).
pub fn order_replicas<'a>(
    holders: &[&'a NodeView],
    client_site: Option<&str>,
) -> Vec<&'a NodeView> {
    let mut v: Vec<&NodeView> = holders.iter().copied().filter(|n| n.up).collect();
    v.sort_by(|a, b| {
        let local = |n: &NodeView| client_site.is_some_and(|s| s == n.site);
        local(b)
            .cmp(&local(a))
            .then(b.rate.cmp(&a.rate))
            .then(a.load.total_cmp(&b.load))
            .then(a.name.cmp(&b.name))
    });
    v
}

#[cfg(test)]
mod tests {
    #[test]
    fn many_small_files_are_spread_over_the_site() {
        let nodes: Vec<NodeView> = ["a1", "a2", "b1"]
            .iter()
            .map(|n| NodeView {
                name: n.to_string(),
                site: if n.starts_with('a') { "A" } else { "B" }.into(),
                free: 1 << 40,
                capacity: 1 << 40,
                load: 0.0,
                up: true,
                draining: false,
                rate: 0,
            })
            .collect();
        let out = place(&[4; 1000], &nodes, Some("A")).unwrap();
        let on = |i| out.iter().filter(|x| **x == i).count();
        assert_eq!(on(2), 0, "the client's site holds them all");
        assert!(on(0).abs_diff(on(1)) <= 1, "{} vs {}", on(0), on(1));
    }

    use super::*;

    const G: u64 = 1 << 30;

    fn node(name: &str, site: &str, free: u64, load: f64) -> NodeView {
        NodeView {
            name: name.into(),
            site: site.into(),
            free,
            capacity: 100 * G,
            load,
            up: true,
            draining: false,
            rate: 0,
        }
    }

    #[test]
    fn own_site_first_then_space_and_load() {
        let nodes = vec![
            node("a1", "A", 10 * G, 0.0),
            node("a2", "A", 20 * G, 0.0),
            node("b1", "B", 90 * G, 0.0),
        ];
        let p = place(&[G], &nodes, Some("A")).unwrap();
        assert_eq!(p, vec![1], "most free space of site A");
        let p = place(&[G], &nodes, None).unwrap();
        assert_eq!(p, vec![2], "no site: most free space overall");
        // Site A cannot hold 40 GiB: everything may go anywhere.
        let p = place(&[20 * G, 20 * G], &nodes, Some("A")).unwrap();
        assert!(p.contains(&2));
        // Load counts.
        let nodes = vec![node("a1", "A", 20 * G, 3.0), node("a2", "A", 15 * G, 0.0)];
        assert_eq!(place(&[G], &nodes, Some("A")).unwrap(), vec![1]);
    }

    #[test]
    fn a_request_spreads_over_nodes() {
        let nodes = vec![node("a1", "A", 10 * G, 0.0), node("a2", "A", 10 * G, 0.0)];
        let p = place(&[G; 8], &nodes, Some("A")).unwrap();
        let on_first = p.iter().filter(|i| **i == 0).count();
        assert_eq!(on_first, 4, "{p:?}");
    }

    #[test]
    fn no_room_and_no_nodes_are_errors() {
        let nodes = vec![node("a1", "A", G, 0.0)];
        assert!(matches!(
            place(&[2 * G], &nodes, None),
            Err(PlaceError::NoSpace { .. })
        ));
        let mut down = node("a1", "A", 10 * G, 0.0);
        down.up = false;
        assert_eq!(place(&[1], &[down], None), Err(PlaceError::NoNodes));
    }

    #[test]
    fn a_draining_node_takes_no_new_files() {
        let mut roomy = node("a1", "A", 90 * G, 0.0);
        roomy.draining = true;
        let nodes = vec![roomy.clone(), node("a2", "A", 10 * G, 0.0)];
        assert_eq!(place(&[G; 4], &nodes, Some("A")).unwrap(), vec![1; 4]);
        assert_eq!(place(&[1], &[roomy], None), Err(PlaceError::NoNodes));
    }

    #[test]
    fn readers_prefer_their_site_then_rate_then_load() {
        let a = node("a1", "A", G, 2.0);
        let mut b1 = node("b1", "B", G, 0.5);
        let mut b2 = node("b2", "B", G, 0.1);
        let order: Vec<&str> = order_replicas(&[&b1, &a, &b2], Some("A"))
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(order, vec!["a1", "b2", "b1"]);
        b1.rate = 500_000_000;
        let order: Vec<&str> = order_replicas(&[&b1, &b2], None)
            .iter()
            .map(|n| n.name.as_str())
            .collect();
        assert_eq!(order, vec!["b1", "b2"]);
        b2.up = false;
        assert_eq!(order_replicas(&[&b2], None).len(), 0);
    }
}
