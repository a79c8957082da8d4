package deploycheck

import (
	"path/filepath"
	"testing"

	"github.com/compose-spec/compose-go/v2/cli"
)

// TestCompose_postgresProfile loads the compose file with the postgres
// profile on and PARLEY_DATABASE_URL set, as its header comment says to
// run it: the database container is there, and exactly the services with
// a PostgreSQL store receive the URL.
func TestCompose_postgresProfile(t *testing.T) {
	const url = "postgres://parley:parley@postgres:5432/parley?sslmode=disable"
	opts, err := cli.NewProjectOptions([]string{composeFile},
		cli.WithWorkingDirectory(filepath.Dir(composeFile)),
		cli.WithInterpolation(true),
		cli.WithConsistency(true),
		cli.WithProfiles([]string{"postgres"}),
		cli.WithEnv([]string{"PARLEY_DATABASE_URL=" + url}),
	)
	if err != nil {
		t.Fatal(err)
	}
	p, err := opts.LoadProject(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	db, ok := p.Services["postgres"]
	if !ok {
		t.Fatal("no postgres service under the postgres profile")
	}
	if db.Image != "postgres:15" || db.HealthCheck == nil || len(db.Ports) != 0 {
		t.Errorf("postgres: image %q, healthcheck %v, ports %v; want postgres:15, a healthcheck, no published port", db.Image, db.HealthCheck, db.Ports)
	}
	for _, s := range parleyServices {
		got, _ := lookupEnv(p.Services[s.name].Environment, "PARLEY_DATABASE_URL")
		want := ""
		if haReplicated[s.name] && s.stateful {
			want = url
		}
		if got != want {
			t.Errorf("service %s: PARLEY_DATABASE_URL = %q, want %q", s.name, got, want)
		}
	}
}
