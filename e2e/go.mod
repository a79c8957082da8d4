module github.com/parleyhq/parley/e2e

go 1.26.0

require (
	github.com/blang/semver/v4 v4.0.0 // indirect
	github.com/compose-spec/compose-go/v2 v2.16.2 // indirect
	go.yaml.in/yaml/v2 v2.4.4 // indirect
	k8s.io/api v0.37.2 // indirect
	k8s.io/apimachinery v0.37.2 // indirect
	sigs.k8s.io/kustomize/api v0.21.2 // indirect
	sigs.k8s.io/kustomize/kyaml v0.21.2 // indirect
	sigs.k8s.io/yaml v1.6.0 // indirect
)
