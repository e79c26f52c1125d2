package clickhouse

import (
	"context"
	"errors"
	"fmt"
	"slices"
)

// columnTypes are the table column types each sink column type fits.
var columnTypes = map[Type][]string{
	String: {"String", "LowCardinality(String)"}, Int32: {"Int32"}, Int64: {"Int64"},
	UInt8: {"UInt8"}, UInt32: {"UInt32"}, UInt64: {"UInt64"},
	DateTime64ms: {"DateTime64(3, 'UTC')", "DateTime64(3)"},
}

// CheckTables tells, before sinks start, whether each sink's table is there
// with every column the sink writes, in a type its encoding fits. Migrate
// brings an older schema up to date; what it cannot mend (a table dropped,
// or a column altered, by hand after its migration was recorded) is an
// error naming the table and the column, rather than a sink that starts
// and then fails every insert.
func CheckTables(ctx context.Context, st Store, sinks ...*Sink) error {
	rows, err := st.QueryStrings(ctx, "SELECT table, name, type FROM system.columns WHERE database = currentDatabase()")
	if err != nil {
		return fmt.Errorf("clickhouse: reading the tables' columns: %w", err)
	}
	tables := map[string]map[string]string{}
	for _, r := range rows {
		if tables[r[0]] == nil {
			tables[r[0]] = map[string]string{}
		}
		tables[r[0]][r[1]] = r[2]
	}
	var errs []error
	for _, s := range sinks {
		have, ok := tables[s.Table]
		if !ok {
			errs = append(errs, fmt.Errorf("%s: table %s is missing though its migration is recorded in schema_migrations; "+
				"restore it, or delete its migration's row there so the next start creates it", s.Name, s.Table))
			continue
		}
		for _, c := range s.Columns {
			typ, ok := have[c.Name]
			switch {
			case !ok:
				errs = append(errs, fmt.Errorf("%s: table %s has no column %s", s.Name, s.Table, c.Name))
			case !slices.Contains(columnTypes[c.Type], typ):
				errs = append(errs, fmt.Errorf("%s: column %s.%s is %s; the sink writes %v", s.Name, s.Table, c.Name, typ, columnTypes[c.Type]))
			}
		}
	}
	return errors.Join(errs...)
}
