//! Node lifecycle, for administrators: draining a node (it takes no new files, and the
//! reconciler moves its replicas to other nodes while every policy holds) and removing one from
//! the registry (once drained, or by force when it is dead and its disk lost). The moving itself
//! is the reconciler's (`reconcile::pass` plans copies off draining nodes with
//! `replication::plan`); this module owns the requests and their checks.

use crate::auth::User;
use crate::error::Error;
use crate::perm;
use crate::state::{Meta, node_info};
use api::meta as pb;
use catalog::CatalogError;
use wire::error::ErrorKind;

/// Paths of orphaned files named in a forced removal's reply and event.
const ORPHANS_NAMED: usize = 100;

impl Meta {
    /// Starts (or with `cancel` ends) the drain of a node.
    pub async fn drain_node(
        &self,
        user: &User,
        q: &pb::DrainRequest,
    ) -> Result<pb::NodeInfo, Error> {
        perm::require_admin(user, "drain a node")?;
        let before = self.known_node(&q.node)?;
        let node = self.catalog.set_drain(&q.node, !q.cancel).await?;
        self.refresh_nodes().await?;
        if q.cancel {
            if before.node.drain_ms != 0 {
                self.event(format!(
                    "{}: drain of node {} cancelled",
                    user.name, node.name
                ));
            }
        } else if before.node.drain_ms == 0 {
            self.event(format!(
                "{}: draining node {} ({} replicas to move)",
                user.name, node.name, node.drain_replicas
            ));
        }
        self.reconcile_now.notify_one();
        let entry = self.known_node(&q.node)?;
        let usage = self.catalog.node_usage().await?;
        Ok(node_info(
            &entry,
            *usage.get(&entry.node.name).unwrap_or(&(0, 0)),
        ))
    }

    /// Removes a node from the registry: refused while it runs (it would register again at
    /// its next heartbeat), and while it holds replicas unless `force`.
    pub async fn remove_node(
        &self,
        user: &User,
        q: &pb::RemoveNodeRequest,
    ) -> Result<pb::RemoveNodeReply, Error> {
        perm::require_admin(user, "remove a node")?;
        // The registry as the catalog has it now (a heartbeat may just have brought it back).
        self.refresh_nodes().await?;
        let entry = self.known_node(&q.node)?;
        if entry.node.up {
            let age = (catalog::now_ms() - entry.node.heartbeat_ms).max(0) as f64 / 1000.0;
            return Err(Error::new(
                ErrorKind::Busy,
                format!(
                    "node {} is running (last heartbeat {age:.1} s ago): stop it first{}",
                    q.node,
                    if entry.node.drain_ms == 0 && !q.force {
                        ", after draining it (haul node drain)"
                    } else {
                        ""
                    }
                ),
            ));
        }
        let reply = if q.force {
            let lost = self.catalog.remove_node_forced(&q.node).await?;
            let mut paths = Vec::new();
            for id in lost.orphaned.iter().take(ORPHANS_NAMED) {
                if let Ok(p) = self.catalog.path_of(*id).await {
                    paths.push(p);
                }
            }
            let text = format!(
                "{}: node {} removed by force: {} replica records dropped, {} files left without a copy",
                user.name,
                q.node,
                lost.replicas,
                lost.orphaned.len()
            );
            tracing::warn!(node = %q.node, orphaned = ?paths, "{text}");
            self.event_about(text, paths.clone());
            pb::RemoveNodeReply {
                replicas: lost.replicas,
                orphaned: lost.orphaned.len() as u64,
                orphaned_paths: paths,
            }
        } else {
            match self.catalog.remove_node(&q.node).await {
                Ok(()) => {}
                Err(CatalogError::NotEmpty(_)) => {
                    let held = self.catalog.node_replicas(&q.node).await?.len();
                    return Err(Error::new(
                        ErrorKind::NotEmpty,
                        format!(
                            "node {} still holds {held} replicas: drain it (haul node drain {}) and let \
                             the drain finish while it runs, or remove it with --force if its disk is lost",
                            q.node, q.node
                        ),
                    ));
                }
                Err(e) => return Err(e.into()),
            }
            self.event(format!("{}: node {} removed", user.name, q.node));
            pb::RemoveNodeReply::default()
        };
        self.refresh_nodes().await?;
        self.reconcile_now.notify_one();
        Ok(reply)
    }

    fn known_node(&self, name: &str) -> Result<crate::state::NodeEntry, Error> {
        self.node(name).ok_or_else(|| {
            let mut names: Vec<String> = self.nodes().into_iter().map(|n| n.node.name).collect();
            names.sort();
            Error::not_found(format!(
                "no node {name:?} is registered (nodes: {})",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            ))
        })
    }
}
