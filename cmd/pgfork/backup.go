package main

import (
	"fmt"
	"path/filepath"
	"text/tabwriter"

	"github.com/spf13/cobra"

	"github.com/pgfork/pgfork/internal/secret"
	"github.com/pgfork/pgfork/pgbackup"
	"github.com/pgfork/pgfork/pgbin"
)

// backupEntry is one backup in `pgfork backup` / `pgfork backup ls` JSON.
type backupEntry struct {
	Name      string `json:"name"`
	Dir       string `json:"dir"`
	Kind      string `json:"kind"`
	Major     int    `json:"major"`
	StartLSN  string `json:"start_lsn"`
	StartTime string `json:"start_time"`
	From      string `json:"incremental_from_lsn,omitempty"`
}

func entryOf(b *pgbackup.Backup) backupEntry {
	e := backupEntry{Name: b.Name(), Dir: b.Dir, Kind: b.Kind(), Major: b.Major, StartLSN: b.Label.StartLSN.String(), StartTime: b.Label.StartTime}
	if b.Label.Incremental() {
		e.From = b.Label.PrevLSN.String()
	}
	return e
}

func (cl *cli) newBackupCmd() *cobra.Command {
	var (
		url         string
		incremental bool
	)
	cmd := &cobra.Command{
		Use:   "backup DIR --url URL [--incremental]",
		Short: "Take a base backup into a chain directory (pg_basebackup, plain format)",
		Long: `Take a base backup of the server at --url into a new directory under DIR, named
by time and kind (20261123T031500Z-full, ...-incr): pg_basebackup in plain
format with a backup manifest (CRC32C), a fast checkpoint and the WAL
streamed, taken into a hidden directory (mode 0700, unpredictable name) and
renamed when complete. One backup at a time per DIR: a second one exits 6 at
once. A killed backup's hidden directory is removed by the next backup and
named by backup ls.

With --incremental (PostgreSQL 17+) the backup is incremental to the newest
backup in DIR; the server needs summarize_wal = on (pgfork says how to turn it
on). pgfork backup ls DIR lists the chain; pgfork restore DIR DST restores
its newest state, or --upto NAME an older one.`,
		Example: `  pgfork backup /backups/main --url postgres://postgres@db:5432/postgres
  pgfork backup /backups/main --url postgres://postgres@db:5432/postgres --incremental
  pgfork backup ls /backups/main
  pgfork restore /backups/main /srv/pg/restored --start --port auto`,
		Args: usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			b, err := pgbackup.Take(cmd.Context(), pgbackup.TakeOptions{Dir: args[0], ConnString: url, Incremental: incremental,
				PGBin: pgbin.Options{Explicit: cl.g.pgBin, StateDir: cl.layout().Root}})
			if err != nil {
				return err
			}
			if cl.g.json {
				return printJSON(cmd.OutOrStdout(), entryOf(b))
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s backup %s (PostgreSQL %d, start %s)\n", b.Kind(), b.Dir, b.Major, b.Label.StartLSN)
			return nil
		},
	}
	cmd.Flags().StringVar(&url, "url", "", "connection URL of the server to back up (a role with REPLICATION), without its password: libpq reads it from PGPASSFILE, ~/.pgpass or PGPASSWORD")
	secret.MarkConn(cmd.Flags(), "url")
	cmd.Flags().BoolVar(&incremental, "incremental", false, "incremental to the newest backup in DIR (PostgreSQL 17+, summarize_wal = on)")
	cmd.AddCommand(&cobra.Command{
		Use:   "ls DIR",
		Short: "List the backups in a chain directory, oldest first",
		Args:  usageArgs(cobra.ExactArgs(1)),
		RunE: func(cmd *cobra.Command, args []string) error {
			all, err := pgbackup.List(args[0])
			if err != nil {
				return err
			}
			for _, n := range pgbackup.StalePartials(args[0]) {
				cl.infof("%s is the unfinished remains of a killed backup; the next `pgfork backup %s` removes it", filepath.Join(args[0], n), args[0])
			}
			if cl.g.json {
				out := []backupEntry{}
				for _, b := range all {
					out = append(out, entryOf(b))
				}
				return printJSON(cmd.OutOrStdout(), out)
			}
			if len(all) == 0 {
				cl.infof("no backups in %s; take one with `pgfork backup %s --url URL`", args[0], args[0])
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tKIND\tPG\tSTART LSN\tSTART TIME\tFROM")
			for _, b := range all {
				fmt.Fprintln(tw, pgbackup.Describe(b, all))
			}
			return tw.Flush()
		},
	})
	return cmd
}
