package dbstore

import "context"

// DropForce runs DROP DATABASE IF EXISTS name WITH (FORCE): the sessions
// connected to it are ended first. For a server shutting down, which must
// not wait for its clients (serve drops its test copies so).
func (c *SQLCreator) DropForce(ctx context.Context, name string) error {
	return dropForce(ctx, c.Admin, name)
}
