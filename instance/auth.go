package instance

import (
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"path/filepath"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/internal/errs"
)

// PasswordHBA is the pg_hba.conf of clusters that listen on TCP: trust only
// on the private Unix socket (its directory is open to the server's OS user
// alone), scram-sha-256 for every TCP connection.
const PasswordHBA = `# pgfork: trust only on the private Unix socket; TCP needs the password.
local all         all trust
local replication all trust
host  all         all 0.0.0.0/0 scram-sha-256
host  all         all ::/0      scram-sha-256
host  replication all 0.0.0.0/0 scram-sha-256
host  replication all ::/0      scram-sha-256
`

// WritePasswordHBA replaces dataDir's pg_hba.conf with PasswordHBA, written
// with u's rights (WriteFileAs): the data directory is u's.
func WritePasswordHBA(dataDir string, u *OSUser) error {
	return WriteFileAs(filepath.Join(dataDir, "pg_hba.conf"), u, []byte(PasswordHBA))
}

// NewPassword returns a random password (32 hex digits: 128 bits).
func NewPassword() string {
	var b [16]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// SetPassword gives role the password, over the private socket. Only its
// SCRAM-SHA-256 verifier is sent, so the password is in no server log.
// ConnString includes it in TCP URLs from then on.
func (inst *Instance) SetPassword(ctx context.Context, role, password string) error {
	if role == "" {
		role = "postgres"
	}
	sock := *inst
	sock.Host = ""
	c, err := pgx.Connect(ctx, sock.ConnString(role, "postgres"))
	if err != nil {
		return errs.Wrap(errs.Internal, err, "cannot connect to set the password").WithPath(inst.DataDir)
	}
	defer c.Close(context.Background())
	v := scramVerifier(password)
	if _, err := c.Exec(ctx, "ALTER ROLE "+pgx.Identifier{role}.Sanitize()+" PASSWORD '"+v+"'"); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot set the password of role %s", role).WithPath(inst.DataDir)
	}
	inst.Password = password
	return nil
}

// scramVerifier returns PostgreSQL's stored form of a SCRAM-SHA-256
// password (RFC 5802/7677, as pg_authid keeps it). password must be ASCII
// (SASLprep leaves it unchanged).
func scramVerifier(password string) string {
	const iter = 4096
	var salt [16]byte
	_, _ = rand.Read(salt[:])
	salted, _ := pbkdf2.Key(sha256.New, password, salt[:], iter, 32)
	mac := func(key []byte, msg string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	clientKey := mac(salted, "Client Key")
	stored := sha256.Sum256(clientKey)
	serverKey := mac(salted, "Server Key")
	b64 := base64.StdEncoding.EncodeToString
	return "SCRAM-SHA-256$4096:" + b64(salt[:]) + "$" + b64(stored[:]) + ":" + b64(serverKey)
}
