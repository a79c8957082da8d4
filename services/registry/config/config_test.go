package config

import (
	"strings"
	"testing"
	"time"
)

func TestLoad_defaults(t *testing.T) {
	c, err := Load(nil, func(string) string { return "" })
	if err != nil {
		t.Fatalf("Load() error = %v", err)
	}
	if c.PDMaxBytes != 256<<10 || c.FetchTimeout != 5*time.Second || c.FetchConnectTimeout != 2*time.Second || c.FetchMaxRedirects != 3 || c.FetchMaxSources != 3 || c.FetchAllowHTTP || c.FetchAllow != "" {
		t.Errorf("Load() = %+v; want the documented defaults", c)
	}
}

func TestLoad_environment(t *testing.T) {
	env := map[string]string{"PARLEY_PD_MAX_BYTES": "1024", "PARLEY_PD_FETCH_ALLOW": "127.0.0.1/32, pd.local", "PARLEY_REGISTRY_PEERS": "a:9090,b:9090", "PARLEY_OPEN_REGISTRATION_BURST": "7"}
	c, err := Load(nil, func(k string) string { return env[k] })
	if err != nil {
		t.Fatalf("Load() error = %v", err)
	}
	if c.PDMaxBytes != 1024 || len(c.AllowList()) != 2 || len(c.PeerList()) != 2 || c.RegistrationBurst != 7 {
		t.Errorf("Load() = %+v, allow %q, peers %q", c, c.AllowList(), c.PeerList())
	}
}

func TestLoad_reportsEveryBadValue(t *testing.T) {
	_, err := Load([]string{"--pd-max-bytes", "0", "--pd-fetch-timeout", "-1s", "--pd-fetch-max-sources", "0", "--pd-fetch-allow", "10.0.0.0/99", "--pd-fetch-max-concurrent", "0", "--pd-fetch-max-per-host", "0", "--registry-peer-sync-interval", "-1s", "--pd-fetch-negative-entries", "0", "--open-registration-burst", "0", "--open-registration-interval", "0s"}, func(string) string { return "" })
	if err == nil {
		t.Fatal("Load(bad values) succeeded")
	}
	for _, flag := range []string{"--pd-max-bytes", "--pd-fetch-timeout", "--pd-fetch-max-sources", "--pd-fetch-allow", "--pd-fetch-max-concurrent", "--pd-fetch-max-per-host", "--registry-peer-sync-interval", "--pd-fetch-negative-entries", "--open-registration-burst", "--open-registration-interval"} {
		if !strings.Contains(err.Error(), flag) {
			t.Errorf("Load() error %q does not name %s", err, flag)
		}
	}
}
