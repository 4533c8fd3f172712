// Module e2e tests the goose and golang-migrate adapters (modules of their
// own) with pgforktest against a live pgfork serve. It is not for users: it
// ties the local modules together with replace directives.
module github.com/pgfork/pgfork/clients/go/migrators/e2e

go 1.24.0

replace (
	github.com/pgfork/pgfork/clients/go => ../..
	github.com/pgfork/pgfork/clients/go/migrators/golangmigrator => ../golangmigrator
	github.com/pgfork/pgfork/clients/go/migrators/goosemigrator => ../goosemigrator
)

require (
	github.com/pgfork/pgfork/clients/go v0.0.0-00010101000000-000000000000
	github.com/pgfork/pgfork/clients/go/migrators/golangmigrator v0.0.0-00010101000000-000000000000
	github.com/pgfork/pgfork/clients/go/migrators/goosemigrator v0.0.0-00010101000000-000000000000
)

require (
	github.com/golang-migrate/migrate/v4 v4.19.1 // indirect
	github.com/google/shlex v0.0.0-20191202100458-e7afc7fbc510 // indirect
	github.com/jackc/pgerrcode v0.0.0-20220416144525-469b46aa5efa // indirect
	github.com/jackc/pgpassfile v1.0.0 // indirect
	github.com/jackc/pgservicefile v0.0.0-20240606120523-5a60cdf6a761 // indirect
	github.com/jackc/pgx/v5 v5.8.0 // indirect
	github.com/jackc/puddle/v2 v2.2.2 // indirect
	github.com/mfridman/interpolate v0.0.2 // indirect
	github.com/pressly/goose/v3 v3.26.0 // indirect
	github.com/sethvargo/go-retry v0.3.0 // indirect
	go.uber.org/multierr v1.11.0 // indirect
	golang.org/x/sync v0.18.0 // indirect
	golang.org/x/text v0.31.0 // indirect
)
