# Quartermaster: `make help` lists the targets.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec
.DEFAULT_GOAL := help

GO ?= go
GOLANGCI_LINT := $(GO) tool -modfile=hack/tools/go.mod golangci-lint
CONTROLLER_GEN := $(GO) tool controller-gen
# The folder hack/k8s-bin.sh builds the Kubernetes binaries into (evaluated per recipe, on demand).
K8S_BIN = $$(hack/k8s-bin.sh | tail -n1)
# The same for the oldest Kubernetes docs/install.md supports: kube-apiserver, etcd and kubectl only.
K8S_MIN_BIN = $$(hack/k8s-bin.sh 1.30 | tail -n1)
# The folder hack/kyverno-bin.sh builds Kyverno's admission and background controllers and copies its CRDs into
# (the e2e runs them against the local cluster; QM_KYVERNO_BIN tells it where they are).
KYVERNO_BIN = $$(hack/kyverno-bin.sh | tail -n1)
# Every controller of cmd/quartermaster: each gets its own generated ClusterRole quartermaster-NAME.
CONTROLLERS := namespaces vmgroups iam mirrors intents
# -p 4: four test packages at once (go test's default is GOMAXPROCS, 2 here); most of them wait on
# their API servers, vcsim's ticks or the AWS CLI, not on the CPU.
TEST_FLAGS ?= -race -count=1 -p 4

##@ General
.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ {printf "  \033[36m%-18s\033[0m %s\n", $$1, $$2} /^##@/ {printf "\n\033[1m%s\033[0m\n", substr($$0, 5)}' $(MAKEFILE_LIST)

##@ Development
.PHONY: manifests
manifests: ## Generate CRDs (config/crd/bases), one ClusterRole (and Roles) per controller (config/rbac/generated) from markers, and the chart's copies.
	$(CONTROLLER_GEN) crd paths=./api/... output:crd:artifacts:config=config/crd/bases
	$(CONTROLLER_GEN) rbac:roleName=quartermaster-manager,fileName=manager.yaml paths=./internal/manager/... \
		output:rbac:artifacts:config=config/rbac/generated
	@for c in $(CONTROLLERS); do \
		echo "$(CONTROLLER_GEN) rbac:roleName=quartermaster-$$c,fileName=$$c.yaml paths=./internal/controller/$$c/..."; \
		$(CONTROLLER_GEN) rbac:roleName=quartermaster-$$c,fileName=$$c.yaml paths=./internal/controller/$$c/... \
			output:rbac:artifacts:config=config/rbac/generated || exit 1; \
	done
	hack/chart-files.sh

.PHONY: generate
generate: ## Generate the DeepCopy methods of the API types.
	$(CONTROLLER_GEN) object paths=./api/...

.PHONY: verify-generated
verify-generated: ## Fail if committed generated files are stale.
	hack/verify-generated.sh

.PHONY: fmt
fmt: ## gofmt and goimports the code.
	$(GOLANGCI_LINT) fmt ./...

.PHONY: lint
lint: ## gofmt check, go vet, golangci-lint, and the alert rules and dashboard through Prometheus's parsers.
	@out="$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))"; \
		if [[ -n "$$out" ]]; then echo "gofmt needed on:"; echo "$$out"; exit 1; fi
	$(GO) vet ./...
	$(GO) vet -tags e2e ./test/...
	$(GOLANGCI_LINT) run --allow-parallel-runners ./...
	cd hack/tools/promlint && $(GO) vet . && $(GO) run . ../../../config/prometheus/prometheusrule.yaml ../../../config/grafana/quartermaster-dashboard.json

.PHONY: build
build: ## Build the manager into bin/quartermaster.
	$(GO) build -o bin/quartermaster ./cmd/quartermaster

# The image: hack/image (go-containerregistry) builds it without a Docker engine. TAG names it in
# the layout and in the registry; REGISTRY is where image-push sends it, as $(REGISTRY)/quartermaster:$(TAG).
IMAGE_DIR ?= bin/image
TAG ?= dev
REGISTRY ?=

.PHONY: image
image: ## Build the manager's image (linux/amd64 + linux/arm64 index, reproducible) without Docker into bin/image/.
	hack/image.sh build --out $(IMAGE_DIR) --tag $(TAG)

.PHONY: image-push
image-push: ## Build the image and push its index as REGISTRY/quartermaster:TAG (make image-push REGISTRY=registry.example.com/team TAG=v0.1.0).
	@if [[ -z "$(REGISTRY)" ]]; then echo "set REGISTRY, e.g. make image-push REGISTRY=registry.example.com/team TAG=v0.1.0" >&2; exit 1; fi
	hack/image.sh build --out $(IMAGE_DIR) --tag $(TAG)
	hack/image.sh push --layout $(IMAGE_DIR)/oci $(REGISTRY)/quartermaster:$(TAG)

# The Helm chart, packaged with appVersion TAG (so its image defaults to quartermaster:TAG; set
# image.repository to where image-push sent it).
CHART_VERSION ?= 0.1.0
.PHONY: chart
chart: ## Package the Helm chart into bin/chart/ (CHART_VERSION, appVersion TAG); helm is hack/helm.sh.
	@mkdir -p bin/chart
	hack/helm.sh package charts/quartermaster --destination bin/chart --version $(CHART_VERSION) --app-version $(TAG)

.PHONY: k8s-bin
k8s-bin: ## Build kube-apiserver, controller-manager, scheduler, kubectl, etcd, kwok(ctl) from source into the cache.
	@hack/k8s-bin.sh

.PHONY: containerd-bin
containerd-bin: ## Build containerd v2 from source into the cache (the e2e tests pull through a mirror with it).
	@hack/containerd-bin.sh

.PHONY: node-bin
node-bin: ## Build what a real node runs (kubelet, kube-proxy, containerd and its shim, runc, CNI plugins, CoreDNS) from source into the cache.
	@hack/node-bin.sh

.PHONY: kyverno-bin
kyverno-bin: ## Build Kyverno's admission and background controllers (v1.19.1) from source into the cache, with its CRDs.
	@hack/kyverno-bin.sh

##@ Test
# Each stage runs through bin/testreport (hack/testreport): its wall and CPU time and result land in
# bin/test-report/, a go test stage's events with them; make test ends with their table.
STAGE = bin/testreport stage

bin/testreport: hack/testreport/main.go
	$(GO) build -o $@ ./hack/testreport

.PHONY: test
test: ## Everything CI runs, in three lanes side by side (hack/test.sh), ending with the table of each stage's time and the slowest tests (bin/test-report/summary.txt).
	hack/test.sh

.PHONY: test-report
test-report: bin/testreport ## Print the table of the last make test's stages and slowest tests again.
	@bin/testreport summary

.PHONY: test-prepare
test-prepare: ## Build (or find in the cache) every binary the test stages run: Kubernetes 1.37 and 1.30, Kyverno, containerd, a real node's parts, Helm.
	@hack/k8s-bin.sh >/dev/null
	@hack/k8s-bin.sh 1.30 >/dev/null
	@hack/kyverno-bin.sh >/dev/null
	@hack/containerd-bin.sh >/dev/null
	@hack/node-bin.sh >/dev/null
	@hack/helm.sh version >/dev/null
	@QM_HELM_MAJOR=3 hack/helm.sh version >/dev/null

.PHONY: test-lint
test-lint: bin/testreport
	@$(STAGE) lint -- $(MAKE) --no-print-directory lint

.PHONY: test-generated
test-generated: bin/testreport
	@$(STAGE) generated -- hack/verify-generated.sh

.PHONY: test-unit
test-unit: bin/testreport ## Unit and envtest integration tests (real kube-apiserver + etcd), with -race.
	KUBEBUILDER_ASSETS="$(K8S_BIN)" $(STAGE) unit -- $(GO) test -json $(TEST_FLAGS) -timeout 20m ./...

.PHONY: test-k8s-min
test-k8s-min: bin/testreport ## What depends on the API server's version (hack/k8s-min-tests.txt: CRD schemas and CEL, admission policies, each controller's kinds and verbs) against the oldest Kubernetes docs/install.md supports (1.30, built from source once into the cache).
	KUBEBUILDER_ASSETS="$(K8S_MIN_BIN)" $(STAGE) k8s-min -- hack/k8s-min.sh

.PHONY: test-stress
test-stress: ## The unit + envtest suite twice at once, three rounds in a row (ROUNDS=n): flakes show here, not in CI.
	hack/test-stress.sh

.PHONY: test-e2e
test-e2e: bin/testreport containerd-bin ## End-to-end tests on a local kwok cluster they create and delete, a containerd daemon of their own (as root) and a real Kyverno (each built once into the cache).
	KUBEBUILDER_ASSETS="$(K8S_BIN)" QM_KYVERNO_BIN="$(KYVERNO_BIN)" $(STAGE) e2e -- $(GO) test -json -tags e2e -count=1 -parallel 8 -timeout 30m ./test/e2e/...

.PHONY: test-real-node
test-real-node: bin/testreport node-bin ## The chart installed with Helm on a real one-node cluster the tests start and stop (hack/real-cluster.sh; as root): Pods run from the project's image, a kubelet pulls through the mirror.
	$(STAGE) real-node -- $(GO) test -json -tags e2e -count=1 -timeout 20m ./test/realnode/...

##@ Local cluster
.PHONY: cluster-up
cluster-up: ## Start the local cluster "quartermaster" (kubeconfig: see hack/cluster.sh).
	@kc="$$(hack/cluster.sh up quartermaster 3)"; echo "export KUBECONFIG=$$kc"

.PHONY: cluster-down
cluster-down: ## Delete the local cluster "quartermaster".
	hack/cluster.sh down quartermaster

# The real one-node cluster's name (hack/real-cluster.sh): several may run side by side.
REAL_CLUSTER ?= quartermaster-real

.PHONY: real-cluster-up
real-cluster-up: ## Start a real one-node cluster REAL_CLUSTER (kubelet, containerd, CoreDNS; as root; prints export KUBECONFIG=…).
	@kc="$$(hack/real-cluster.sh up $(REAL_CLUSTER) | tail -n1)"; echo "export KUBECONFIG=$$kc"

.PHONY: real-cluster-down
real-cluster-down: ## Stop the real cluster REAL_CLUSTER and put back everything it changed on the machine.
	hack/real-cluster.sh down $(REAL_CLUSTER)

.PHONY: demo
demo: ## From nothing to a running system: cluster, CRDs, RBAC, manager (as its ServiceAccount), samples, a registry mirror pulled through, Kyverno enforcing an intent (QM_DEMO_CLUSTER names the cluster).
	hack/demo.sh up

.PHONY: demo-down
demo-down: ## Stop everything the demo started (processes, Kyverno's webhooks, folders) and delete its cluster.
	hack/demo.sh down

.PHONY: bench
bench: ## Benchmark report on a fresh local cluster (ratios measured in one run).
	KUBEBUILDER_ASSETS="$(K8S_BIN)" $(GO) run ./test/bench
