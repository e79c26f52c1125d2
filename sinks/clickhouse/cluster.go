package clickhouse

import (
	"fmt"
	"regexp"
	"strings"
)

// Cluster rewrites the migrations for a ClickHouse cluster (a name from the
// servers' remote_servers): each table becomes a replicated local table on
// every node, <name>_local with Replicated<engine>, and a Distributed table
// <name> over them, so sinks insert and reconciliation reads through the
// same names as on one server. Every statement runs ON CLUSTER.
//
// Rows are spread over shards by a hash of the table's whole sort key: rows
// a ReplacingMergeTree or AggregatingMergeTree folds together share the
// key, so they meet on one shard and fold as on one server.
type Cluster struct {
	Name string
	// ZooPath is the replication path prefix of the local tables; the
	// servers' {shard} and {replica} macros complete it.
	ZooPath string
}

var (
	createTable = regexp.MustCompile(`(?is)^(.*?)CREATE TABLE IF NOT EXISTS (\w+) \((.*)\)\s*ENGINE\s*=\s*(\w+)(\((.*?)\))?(.*)$`)
	orderBy     = regexp.MustCompile(`(?is)ORDER BY\s+(\([^)]*\)|[\w]+)`)
	alterTable  = regexp.MustCompile(`(?is)^(.*?)ALTER TABLE (\w+)(.*)$`)
	createView  = regexp.MustCompile(`(?is)^(.*?)CREATE MATERIALIZED VIEW IF NOT EXISTS (\w+) TO (\w+) AS(.*)\bFROM (\w+)(.*)$`)
	insertFrom  = regexp.MustCompile(`(?is)^(.*?)INSERT INTO (\w+)\s`)
)

// Rewrite is migration sql (statements separated by ";") as it runs on
// the cluster: its statements' cluster forms, in order.
func (c Cluster) Rewrite(sql string) ([]string, error) {
	var out []string
	// Comments go first: they may hold a ";".
	for _, stmt := range strings.Split(stripComments(sql), ";") {
		if stmt = strings.TrimSpace(stmt); stmt == "" {
			continue
		}
		forms, err := c.rewrite(stmt)
		if err != nil {
			return nil, err
		}
		out = append(out, forms...)
	}
	return out, nil
}

func stripComments(sql string) string {
	lines := strings.Split(sql, "\n")
	for i, line := range lines {
		if j := strings.Index(line, "--"); j >= 0 {
			lines[i] = line[:j]
		}
	}
	return strings.Join(lines, "\n")
}

func (c Cluster) rewrite(sql string) ([]string, error) {
	on := " ON CLUSTER " + quoteIdent(c.Name)
	if m := createTable.FindStringSubmatch(sql); m != nil {
		lead, table, cols, engine, args, rest := m[1], m[2], m[3], m[4], m[6], m[7]
		ob := orderBy.FindStringSubmatch(rest)
		if ob == nil {
			return nil, fmt.Errorf("table %s has no ORDER BY to shard by", table)
		}
		local := table + "_local"
		replArgs := fmt.Sprintf("'%s/{shard}/{database}/%s', '{replica}'", strings.TrimRight(c.zooPath(), "/"), local)
		if strings.TrimSpace(args) != "" {
			replArgs += ", " + args
		}
		return []string{
			fmt.Sprintf("%sCREATE TABLE IF NOT EXISTS %s%s (%s) ENGINE = Replicated%s(%s)%s", lead, local, on, cols, engine, replArgs, rest),
			fmt.Sprintf("CREATE TABLE IF NOT EXISTS %s%s AS %s ENGINE = Distributed(%s, currentDatabase(), %s, cityHash64%s)",
				table, on, local, quoteString(c.Name), local, tuple(ob[1])),
		}, nil
	}
	if m := createView.FindStringSubmatch(sql); m != nil {
		// Each node's view folds what is inserted into its own shard.
		lead, view, to, sel, from, rest := m[1], m[2], m[3], m[4], m[5], m[6]
		return []string{fmt.Sprintf("%sCREATE MATERIALIZED VIEW IF NOT EXISTS %s%s TO %s_local AS%sFROM %s_local%s", lead, view, on, to, sel, from, rest)}, nil
	}
	if m := alterTable.FindStringSubmatch(sql); m != nil {
		// The local tables hold the data; the Distributed one's columns
		// must say the same.
		lead, table, rest := m[1], m[2], m[3]
		return []string{
			fmt.Sprintf("%sALTER TABLE %s_local%s%s", lead, table, on, rest),
			fmt.Sprintf("ALTER TABLE %s%s%s", table, on, rest),
		}, nil
	}
	if insertFrom.MatchString(sql) {
		return []string{sql}, nil // through the Distributed tables: read from every shard, written by key
	}
	return nil, fmt.Errorf("no cluster form for statement: %.80s", strings.TrimSpace(sql))
}

func (c Cluster) zooPath() string {
	if c.ZooPath == "" {
		return "/clickhouse/tables"
	}
	return c.ZooPath
}

// tuple is an ORDER BY expression as a parenthesised argument list.
func tuple(expr string) string {
	if strings.HasPrefix(expr, "(") {
		return expr
	}
	return "(" + expr + ")"
}

func quoteIdent(s string) string  { return "`" + strings.ReplaceAll(s, "`", "``") + "`" }
func quoteString(s string) string { return "'" + strings.ReplaceAll(s, "'", "\\'") + "'" }
