package e2e

import (
	"regexp"
	"strings"
	"testing"
)

// allowedPgx matches the packages that may import github.com/jackc/pgx: the
// shared skeleton, its test helper and each service's PostgreSQL backend.
// Everything else goes through a store.Store.
var allowedPgx = regexp.MustCompile(`^github\.com/parleyhq/parley/(platform/pgdb|platform/pgdb/pgdbtest|services/[a-z]+/internal/store/pgstore)$`)

const pgxModule = "github.com/jackc/pgx/v5"

// TestArch_onlyPgstoresImportPgx fails on any other package of the
// workspace that imports pgx, test files included.
func TestArch_onlyPgstoresImportPgx(t *testing.T) {
	checkImports(t, allowedPgx, pgxModule, "only platform/pgdb and pgstore packages may import pgx")
}

// TestArch_pgxRuleCatchesAViolation keeps the check above able to fail.
func TestArch_pgxRuleCatchesAViolation(t *testing.T) {
	graph := strings.Join([]string{
		"github.com/parleyhq/parley/platform/pgdb|github.com/jackc/pgx/v5 github.com/jackc/pgx/v5/pgxpool",
		"github.com/parleyhq/parley/services/tasks/internal/store/pgstore|github.com/jackc/pgx/v5  ",
		"github.com/parleyhq/parley/services/tasks/internal/server|context  github.com/jackc/pgx/v5/pgconn",
		"github.com/parleyhq/parley/services/registry/app|github.com/jackc/pgx/v5  ",
		"github.com/parleyhq/parley/services/registry/app2|github.com/jackc/pgx/v55  ",
	}, "\n")
	got, _ := importViolations(graph, allowedPgx, pgxModule)
	want := []string{
		"github.com/parleyhq/parley/services/tasks/internal/server imports github.com/jackc/pgx/v5/pgconn",
		"github.com/parleyhq/parley/services/registry/app imports github.com/jackc/pgx/v5",
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("violations = %q, want %q", got, want)
	}
}
