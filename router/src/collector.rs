//! What `nereid router` reports on `/metrics`: its gauges read at scrape time (requests in
//! flight, the routing table's revision, outstanding requests per replica) and the counters of
//! `metrics`.

use std::sync::Arc;

use nereid_telemetry::{Collect, Family, Labels};

use crate::metrics::replica_in_flight;
use crate::service::RouterService;
use crate::table::SharedTable;

/// Everything `nereid router` reports on `/metrics`.
pub struct RouterCollector {
    /// The service whose in-flight count and counters are reported.
    pub router: Arc<RouterService>,
    /// The routing table the revision and per-replica gauges are read from at each scrape.
    pub table: Arc<SharedTable>,
}

impl Collect for RouterCollector {
    fn collect(&self) -> Vec<Family> {
        let table = self.table.load();
        let mut families = vec![
            Family::gauge(
                "nereid_router_in_flight",
                "Requests in flight through this router.",
            )
            .with(Labels::none(), self.router.in_flight() as f64),
            Family::gauge(
                "nereid_router_table_revision",
                "Cluster state revision of the routing table.",
            )
            .with(Labels::none(), table.revision() as f64),
            replica_in_flight(&table, &self.router.outstanding()),
        ];
        let mut nodes: Vec<String> = table
            .models()
            .flat_map(|m| table.replicas_of(&m.name).map(|r| r.node.clone()))
            .collect();
        nodes.sort();
        nodes.dedup();
        families.extend(self.router.metrics().families(&nodes));
        families
    }
}
