// Package pgbackup reads what pg_basebackup writes: backup_manifest, the
// INCREMENTAL.* files of incremental backups (PostgreSQL 17+) and, through
// package pgdata's parser, backup_label; it checks that a list of backups
// forms a chain that can be combined, finds chains in a directory and runs
// pg_basebackup to add to one. It knows the formats, not how to rebuild a
// data directory (package restore does that).
package pgbackup
