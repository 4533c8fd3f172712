package managed

import (
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// portFile, in the managed server's directory, holds the TCP port it last
// listened on: a restart takes the same port when it is free, so that the
// URLs printed for kept databases stay right.
const portFile = "port"

// previousPort returns the port the server in dir last listened on, if
// it is free on 127.0.0.1 now; 0 otherwise (a fresh one is picked).
func previousPort(dir string) int {
	b, err := os.ReadFile(filepath.Join(dir, portFile))
	if err != nil {
		return 0
	}
	port, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil || port < 1024 || port > 65535 {
		return 0
	}
	l, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
	if err != nil {
		return 0 // taken by another process
	}
	_ = l.Close()
	return port
}

// rememberPort records the port the server in dir listens on. A failure
// only costs the next start its preference.
func rememberPort(dir string, port int) {
	_ = os.WriteFile(filepath.Join(dir, portFile), []byte(strconv.Itoa(port)+"\n"), 0o644)
}
