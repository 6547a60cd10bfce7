//! The simulation's scheduler: pods that name no node are spread round robin over the nodes, in the
//! order they are applied (embedded API or a real cluster's alike).

/// Round robin over a fixed list of nodes.
#[derive(Debug, Default)]
pub struct RoundRobin {
    next: usize,
}

impl RoundRobin {
    /// The node the next pod goes to, out of `nodes` (never empty: a simulation has at least one node).
    pub fn schedule<'a>(&mut self, nodes: impl ExactSizeIterator<Item = &'a str>) -> String {
        let len = nodes.len().max(1);
        let node = nodes.into_iter().nth(self.next % len).unwrap_or_default();
        self.next += 1;
        node.to_string()
    }
}
