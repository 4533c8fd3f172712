package sharedsuite_test

import (
	"context"
	"fmt"
	"testing"

	"github.com/jackc/pgx/v5"

	"github.com/pgfork/pgfork/clients/go/internal/sharedsuite"
	"github.com/pgfork/pgfork/clients/go/pgforktest"
)

// TestFromSecondProcess uses the same template as pgforktest's TestIsolation;
// go test runs the two packages in parallel processes, so one of them gets
// 423 and waits for the other's template to be finalized.
func TestFromSecondProcess(t *testing.T) {
	for i := range 6 {
		name := fmt.Sprintf("other%d", i)
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			url := pgforktest.New(t, sharedsuite.Options())
			conn, err := pgx.Connect(t.Context(), url)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { conn.Close(context.Background()) })
			sharedsuite.CheckIsolated(t, conn, name)
		})
	}
}
