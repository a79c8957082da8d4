package deploycheck

import (
	"errors"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

// The ha overlay (deploy/k8s/overlays/ha) runs every service with a
// PostgreSQL store, and the stateless gateway, as haReplicas replicas.
const haReplicas = 3

var haReplicated = map[string]bool{"registry": true, "negotiator": true, "dispatcher": true, "tasks": true, "gateway": true}

// checkHA holds a rendering of the ha overlay to its rules: the replicated
// services get replicas, RollingUpdate with at most one pod down, a
// PodDisruptionBudget of one, no volume or claim, and (those with state)
// PARLEY_DATABASE_URL from a Secret, never inline; everything else base
// demands (images, probes, security, peers) still holds.
func checkHA(m *manifests) error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if got, want := slices.Sorted(maps.Keys(m.deployments)), serviceNames(); !slices.Equal(got, want) {
		fail("Deployments = %v, want %v", got, want)
	}
	if got := slices.Sorted(maps.Keys(m.claims)); len(got) != 0 {
		fail("PersistentVolumeClaims = %v, want none: every store is in PostgreSQL", got)
	}
	for _, want := range parleyServices {
		d, ok := m.deployments[want.name]
		if !ok {
			continue
		}
		if s, ok := m.services[want.name]; !ok {
			fail("no Service %s", want.name)
		} else {
			for _, err := range checkService(s, d, want) {
				fail("Service %s: %w", want.name, err)
			}
		}
		if !haReplicated[want.name] {
			for _, err := range checkDeployment(d, want, "") {
				fail("Deployment %s: %w", want.name, err)
			}
			continue
		}
		// Base's rules, but for the replica count and the volume.
		one := int32(1)
		norm := d.DeepCopy()
		norm.Spec.Replicas = &one
		stateless := want
		stateless.stateful = false
		for _, err := range checkDeployment(norm, stateless, "") {
			fail("Deployment %s: %w", want.name, err)
		}
		for _, err := range checkReplicated(d, want) {
			fail("Deployment %s: %w", want.name, err)
		}
		for _, err := range checkBudget(m, d) {
			fail("PodDisruptionBudget %s: %w", want.name, err)
		}
	}
	for name := range m.budgets {
		if !haReplicated[name] {
			fail("PodDisruptionBudget %s: not a replicated service", name)
		}
	}
	return errors.Join(errs...)
}

// checkReplicated checks what lets a Deployment run several pods at once.
func checkReplicated(d *appsv1.Deployment, want parleyService) []error {
	var errs []error
	fail := func(format string, args ...any) { errs = append(errs, fmt.Errorf(format, args...)) }
	if d.Spec.Replicas == nil || *d.Spec.Replicas != haReplicas {
		fail("replicas = %s, want %d", ptrString(d.Spec.Replicas), haReplicas)
	}
	st := d.Spec.Strategy
	if st.Type != appsv1.RollingUpdateDeploymentStrategyType {
		fail("strategy = %q, want RollingUpdate", st.Type)
	} else if st.RollingUpdate == nil || st.RollingUpdate.MaxUnavailable == nil || *st.RollingUpdate.MaxUnavailable != intstr.FromInt32(1) {
		fail("rollingUpdate.maxUnavailable unset or not 1: a rollout must keep %d of %d serving", haReplicas-1, haReplicas)
	}
	spec := d.Spec.Template.Spec
	for _, v := range spec.Volumes {
		if v.PersistentVolumeClaim != nil || v.HostPath != nil {
			fail("volume %s is persistent: replicas share nothing but the database", v.Name)
		}
	}
	for _, c := range spec.Containers {
		for _, vm := range c.VolumeMounts {
			if vm.MountPath == dataDir {
				fail("a volume is mounted at %s", dataDir)
			}
		}
		if !want.stateful {
			continue
		}
		var url *corev1.EnvVar
		for i := range c.Env {
			if c.Env[i].Name == "PARLEY_DATABASE_URL" {
				url = &c.Env[i]
			}
		}
		switch {
		case url == nil:
			fail("no PARLEY_DATABASE_URL")
		case url.Value != "" || url.ValueFrom == nil || url.ValueFrom.SecretKeyRef == nil:
			fail("PARLEY_DATABASE_URL is not from a Secret (it holds a password)")
		case url.ValueFrom.SecretKeyRef.Name == "" || url.ValueFrom.SecretKeyRef.Key == "":
			fail("PARLEY_DATABASE_URL's secretKeyRef names no Secret or key")
		}
	}
	return errs
}

// checkBudget checks that a PodDisruptionBudget selects exactly d's pods and
// lets one of them go at a time.
func checkBudget(m *manifests, d *appsv1.Deployment) []error {
	b, ok := m.budgets[d.Name]
	if !ok {
		return []error{errors.New("missing")}
	}
	var errs []error
	if b.Spec.Selector == nil || !maps.Equal(b.Spec.Selector.MatchLabels, d.Spec.Selector.MatchLabels) || len(b.Spec.Selector.MatchExpressions) > 0 {
		errs = append(errs, fmt.Errorf("selector %v does not select Deployment %s's pods (%v)", b.Spec.Selector, d.Name, d.Spec.Selector.MatchLabels))
	}
	if b.Spec.MaxUnavailable == nil || *b.Spec.MaxUnavailable != intstr.FromInt32(1) || b.Spec.MinAvailable != nil {
		errs = append(errs, errors.New("want maxUnavailable 1 (and no minAvailable)"))
	}
	return errs
}

// checkHATree renders the ha overlay of a deploy/k8s tree and checks it.
func checkHATree(root string) error {
	m, err := renderKustomization(filepath.Join(root, "overlays", "ha"))
	if err != nil {
		return err
	}
	if err := checkHA(m); err != nil {
		return fmt.Errorf("overlays/ha: %w", err)
	}
	return nil
}

func TestKustomize_haOverlayFollowsPolicy(t *testing.T) {
	if err := checkHATree(k8sDir); err != nil {
		t.Errorf("checkHATree(%q) = %v, want nil", k8sDir, err)
	}
}

func TestKustomize_haRejectsBrokenOverlay(t *testing.T) {
	const (
		replicated = "overlays/ha/replicated.yaml"
		noVolumes  = "overlays/ha/no-volumes.yaml"
		pdb        = "overlays/ha/pdb.yaml"
		kust       = "overlays/ha/kustomization.yaml"
	)
	tests := []struct {
		name    string
		edit    edit
		wantErr string
	}{
		{
			name:    "two replicas",
			edit:    edit{file: replicated, old: "  replicas: 3\n", new: "  replicas: 2\n"},
			wantErr: "Deployment registry: replicas = 2, want 3",
		},
		{
			name:    "recreate",
			edit:    edit{file: replicated, old: "    type: RollingUpdate\n", new: "    type: Recreate\n    rollingUpdate: null\n"},
			wantErr: `Deployment registry: strategy = "Recreate"`,
		},
		{
			name:    "rollout takes two down",
			edit:    edit{file: replicated, old: "      maxUnavailable: 1\n", new: "      maxUnavailable: 2\n"},
			wantErr: "Deployment registry: rollingUpdate.maxUnavailable",
		},
		{
			name: "inline database URL",
			edit: edit{file: replicated, old: "              valueFrom:\n                secretKeyRef:\n                  name: parley-database\n                  key: url\n",
				new: "              value: postgres://parley:hunter2@db/parley\n"},
			wantErr: "Deployment registry: PARLEY_DATABASE_URL is not from a Secret",
		},
		{
			name:    "volume kept",
			edit:    edit{file: noVolumes, old: "      volumes:\n        - name: data\n          $patch: delete\n", new: ""},
			wantErr: "Deployment registry: volume data is persistent",
		},
		{
			name:    "claim kept",
			edit:    edit{file: kust, old: "  - patch: |-\n      $patch: delete\n      apiVersion: v1\n      kind: PersistentVolumeClaim\n      metadata:\n        name: tasks-data\n", new: ""},
			wantErr: "PersistentVolumeClaims = [tasks-data]",
		},
		{
			name:    "budget missing",
			edit:    edit{file: pdb, old: "  name: gateway\n", new: "  name: gateway-pdb\n"},
			wantErr: "PodDisruptionBudget gateway: missing",
		},
		{
			name:    "budget selects other pods",
			edit:    edit{file: pdb, old: "      app.kubernetes.io/name: tasks", new: "      app.kubernetes.io/name: task"},
			wantErr: "PodDisruptionBudget tasks: selector",
		},
		{
			name:    "budget lets two go",
			edit:    edit{file: pdb, old: "  maxUnavailable: 1\n", new: "  maxUnavailable: 2\n"},
			wantErr: "want maxUnavailable 1",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			root := t.TempDir()
			if err := copyTree(k8sDir, root); err != nil {
				t.Fatal(err)
			}
			tt.edit.apply(t, root)
			err := checkHATree(root)
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("checkHATree(broken: %s) = %v, want an error containing %q", tt.name, err, tt.wantErr)
			}
		})
	}
}
