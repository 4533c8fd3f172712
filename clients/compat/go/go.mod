// Module compat runs IntegreSQL's official Go client against pgfork serve
// (clients/compat/run.sh starts the servers). It is not for users.
module github.com/pgfork/pgfork/clients/compat/go

go 1.24.0

require (
	github.com/allaboutapps/integresql-client-go v1.0.0
	github.com/lib/pq v1.3.0
)
