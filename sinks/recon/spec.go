package recon

import (
	"surge/schemas"
	"surge/streams"
)

// Spec is reconciliation's topology: it reads the sinks' tables in
// ClickHouse, not topics, and publishes its results.
var Spec = streams.Spec{
	Name:    "recon",
	Outputs: []string{schemas.TopicRecon},
	Stores:  []string{"clickhouse: reads the sinks' tables, writes recon_results"},
	Doc:     "`surge recon serve`: hourly (h+1, h+2) and per-minute reconciliation",
}
