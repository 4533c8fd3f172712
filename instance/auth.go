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
	"strconv"

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
	v := ScramVerifier(password)
	if _, err := c.Exec(ctx, "ALTER ROLE "+pgx.Identifier{role}.Sanitize()+" PASSWORD '"+v+"'"); err != nil {
		return errs.Wrap(errs.Internal, err, "cannot set the password of role %s", role).WithPath(inst.DataDir)
	}
	inst.Password = password
	return nil
}

// GeneratedPasswordIterations is the SCRAM-SHA-256 iteration count of the
// verifiers pgfork stores for the passwords it generates itself
// (NewPassword, secret.Password: 128 random bits, 32 hex digits). The
// iteration count slows the guessing of a password from a stolen verifier;
// a 128-bit random password cannot be guessed at any count, while every
// count costs each connecting client that many HMAC rounds of CPU (4096,
// PostgreSQL's default, take 0.2-0.3 s in a debug build of a Rust client:
// issue 33), but lib/pq (dbmate, many Go tools) refuses a count below
// 4096 (RFC 7677's minimum): so 4096, and a client on the same host
// skips SCRAM altogether on the managed server's private socket, whose
// directory `pgfork serve` names on request (docs/server.md, "Connecting
// fast").
// Any other password gets DefaultIterations.
const GeneratedPasswordIterations = 4096

// DefaultIterations is PostgreSQL's default scram_iterations, used for
// passwords pgfork did not generate.
const DefaultIterations = 4096

// IsGenerated says whether password has the form of one pgfork generates
// (32 lowercase hex digits: 128 bits).
func IsGenerated(password string) bool {
	if len(password) != 32 {
		return false
	}
	for _, c := range password {
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// ScramVerifier returns PostgreSQL's stored form of a SCRAM-SHA-256
// password (RFC 5802/7677, as pg_authid keeps it): GeneratedPasswordIterations
// for a password IsGenerated, else DefaultIterations. Sent as the PASSWORD
// of CREATE/ALTER ROLE, the password itself never reaches the server (nor
// its log). password must be ASCII (SASLprep leaves it unchanged).
func ScramVerifier(password string) string {
	iter := DefaultIterations
	if IsGenerated(password) {
		iter = GeneratedPasswordIterations
	}
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
	return "SCRAM-SHA-256$" + strconv.Itoa(iter) + ":" + b64(salt[:]) + "$" + b64(stored[:]) + ":" + b64(serverKey)
}
