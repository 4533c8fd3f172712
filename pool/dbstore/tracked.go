package dbstore

import (
	"context"

	"github.com/pgfork/pgfork/internal/errs"
)

// trackTable records the test databases made by a server by oid, which a
// rename does not change: a client that renames its test database cannot
// make it outlive an admin reset or a restart.
const trackTable = "pgfork_serve_databases"

// Create makes the copy and records its oid (when template state is kept).
func (s *adminStore) Create(ctx context.Context, name, template, owner string) (string, error) {
	strategy, err := s.Creator.Create(ctx, name, template, owner)
	if err != nil || s.prefix == "" {
		return strategy, err
	}
	if _, err := s.admin.Exec(ctx, `INSERT INTO `+trackTable+` (prefix, oid)
		SELECT $1, oid FROM pg_database WHERE datname = $2 ON CONFLICT DO NOTHING`, s.prefix, name); err != nil {
		return strategy, errs.Wrap(errs.Internal, err, "cannot record test database %s", name)
	}
	return strategy, nil
}

// Sweep drops every recorded test database that still exists, under
// whatever name it has now (with renamedOnly, only those no longer named
// <prefix>_test_…: the others belong to live pools), and forgets the
// records of those gone.
func (s *adminStore) Sweep(ctx context.Context, renamedOnly bool) error {
	if s.prefix == "" {
		return nil
	}
	rows, err := s.admin.Query(ctx, `SELECT d.datname FROM `+trackTable+` t JOIN pg_database d ON d.oid = t.oid
		WHERE t.prefix = $1 AND NOT ($2 AND starts_with(d.datname, $3))`, s.prefix, renamedOnly, s.prefix+"_test_")
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot list test databases")
	}
	var names []string
	for rows.Next() {
		var n string
		if err := rows.Scan(&n); err != nil {
			rows.Close()
			return err
		}
		names = append(names, n)
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot list test databases")
	}
	if err := dropAll(ctx, s.admin, names); err != nil {
		return err
	}
	if _, err := s.admin.Exec(ctx, `DELETE FROM `+trackTable+` t WHERE prefix = $1
		AND NOT EXISTS (SELECT 1 FROM pg_database d WHERE d.oid = t.oid)`, s.prefix); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot forget dropped test databases")
	}
	return nil
}

// initTracking creates the table and sweeps what an earlier run left.
func (s *adminStore) initTracking(ctx context.Context, prefix string) error {
	if _, err := s.admin.Exec(ctx, `CREATE TABLE IF NOT EXISTS `+trackTable+` (
		prefix text NOT NULL, oid oid NOT NULL, PRIMARY KEY (prefix, oid))`); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot create the table %s", trackTable)
	}
	s.prefix = prefix
	return s.Sweep(ctx, false)
}
