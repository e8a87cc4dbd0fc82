#!/usr/bin/env bash
# A real one-node Kubernetes cluster on this machine, beside the kwok one (hack/cluster.sh): etcd,
# kube-apiserver, kube-controller-manager and kube-scheduler as processes, and a node that runs Pods
# (kubelet, containerd with runc, the CNI bridge, kube-proxy), CoreDNS as a Deployment and a default
# StorageClass (the controller-manager's hostPath provisioner). Every binary is built from the Go
# module proxy into the cache (hack/k8s-bin.sh, hack/node-bin.sh). Runs as root.
#
#   hack/real-cluster.sh up [NAME]           start the cluster (a leftover of NAME is torn down first);
#                                            prints the admin kubeconfig's path on its last line
#   hack/real-cluster.sh down [NAME]         stop it and put back everything it changed
#   hack/real-cluster.sh load NAME [--base-name REPO] TAR...
#                                            import image archives into the node's containerd
#   hack/real-cluster.sh env [NAME]          print the cluster's facts (KEY=VALUE lines, see below)
#   hack/real-cluster.sh gc                  tear down every cluster left by a killed run: one whose
#                                            owner (QM_REAL_CLUSTER_OWNER, a pid, given to its up) is
#                                            gone, or without an owner none of whose processes runs;
#                                            never one an `up` is starting
#
# NAME defaults to "quartermaster"; the cluster lives in
# ${XDG_CACHE_HOME:-~/.cache}/quartermaster/real-clusters/NAME (logs/ has each component's log).
#
# Isolation. The node and its Pods live in a network namespace of their own with no default route:
# nothing a Pod or the node does can leave the machine. Its processes (containerd, its shims, runc,
# the kubelet, kube-proxy) share a mount namespace of their own, a slave of the host's, in which
# /run is a fresh tmpfs and /etc and /var/lib are overlays whose writes land in the cluster's folder:
# the paths a node hard-codes (/etc/containerd/certs.d, which the registry mirror's agent writes
# through its hostPath, /var/lib/kubelet/device-plugins, /var/lib/cni, /run/containerd) stay
# private to this cluster. Both namespaces are files in the cluster's folder (no `ip netns` name).
# Each cluster takes a free 10.N.0.0/16 (N from 100 to 199):
#   10.N.0.1/24    the host's end of the veth: kube-apiserver :6443 (what the node and Pods reach);
#                  servers a test runs for Pods to reach (an upstream registry, emulators) bind here
#   10.N.0.2/24    the node (its end of the veth)
#   10.N.64.0/18   Service addresses (kubernetes 10.N.64.1, kube-dns 10.N.64.10)
#   10.N.128.0/17  Pod addresses (the node's podCIDR 10.N.128.0/24)
#   127.0.N.1      etcd, the controller-manager's and the scheduler's ports (loopback, host only)
# so two clusters run side by side. The host routes 10.N.64.0/18 and 10.N.128.0/17 to the node; the
# routes go with the veth. The kubelet's cgroups are under /qm-N in every hierarchy.
#
# What it changes outside its folder, and `down` puts back: the veth (and its routes), the cgroups
# /sys/fs/cgroup/*/qm-N, the machine-wide sysctls the kubelet sets (recorded before the first
# cluster starts, restored when the last stops), and the hostPath provisioner's volumes
# /tmp/hostpath_pv/<uid> of this cluster's PersistentVolumes (read from the API before it stops).
# A run killed at any point leaves files and processes that the next `up` or `down` of the same
# NAME removes.
#
# env prints: DIR, KUBECONFIG, HOST_IP (10.N.0.1), NODE_IP, NODE_NAME, POD_CIDR, SERVICE_CIDR,
# DNS_IP, NODE_NET (the network namespace file), NODE_MNT (the mount namespace file), CONTAINERD
# (its socket), CTR (the ctr binary), BIN (the control plane's folder).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache_root="${QM_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/quartermaster}"
cmd="${1:-up}"
name="${2:-quartermaster}"
if [[ ! "${name}" =~ ^[a-z0-9][a-z0-9-]{0,30}$ ]]; then
	echo "real-cluster: NAME ${name@Q}: lower-case letters, digits and -, at most 31" >&2
	exit 2
fi
root="${cache_root}/real-clusters"
dir="${root}/${name}"

log() { echo "real-cluster ${name}: $*" >&2; }
die() { log "$*"; exit 1; }

[[ "$(id -u)" == 0 ]] || die "must run as root (network namespaces, mounts, cgroups, runc)"

# The sysctls the kubelet sets machine-wide (its kernel defaults).
SYSCTLS=(kernel.panic kernel.panic_on_oops vm.overcommit_memory vm.panic_on_oom kernel.keys.root_maxkeys kernel.keys.root_maxbytes)

# ---------------------------------------------------------------------------------------------------
# Teardown: works on whatever a run left, in any state.

pids_of_cgroup() { # every process in the cgroups under /sys/fs/cgroup/*/qm-N
	local n="$1"
	# None may exist (a start killed before the kubelet ran): nothing to print, no failure.
	{ find /sys/fs/cgroup/*/"qm-${n}" -name cgroup.procs -exec cat {} + 2>/dev/null || true; } | sort -u
}

running() { # running PID: the process exists and is no zombie (exited processes of a killed `up` wait for init to reap them)
	local state
	state="$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" || return 1
	[[ -n "${state}" && "${state}" != Z ]]
}

stop() { # stop NAME...: SIGTERM to each component's process, SIGKILL to those still running after 10 s
	local c pid pids=() i
	for c in "$@"; do
		local f="${dir}/pids/${c}"
		[[ -f "${f}" ]] || continue
		pid="$(cat "${f}")"
		rm -f "${f}"
		# Only a process started from this folder: a pid reused after a reboot is someone else's.
		if [[ -n "${pid}" ]] && running "${pid}" && tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -qF "${dir}"; then
			kill "${pid}" 2>/dev/null || true
			pids+=("${pid}")
		fi
	done
	for ((i = 0; i < 100; i++)); do
		local left=()
		for pid in "${pids[@]}"; do running "${pid}" && left+=("${pid}"); done
		pids=("${left[@]}")
		((${#pids[@]})) || return 0
		sleep 0.1
	done
	kill -9 "${pids[@]}" 2>/dev/null || true
}

teardown() {
	[[ -d "${dir}" ]] || return 0
	local n=""
	[[ -f "${dir}/net-index" ]] && n="$(cat "${dir}/net-index")"
	log "stopping"
	# The hostPath provisioner's volumes of this cluster, while the API still answers.
	if [[ -f "${dir}/admin.kubeconfig" && -x "${dir}/bin/kubectl" ]]; then
		"${dir}/bin/kubectl" --kubeconfig "${dir}/admin.kubeconfig" --request-timeout 5s get pv \
			-o jsonpath='{range .items[*]}{.spec.hostPath.path}{"\n"}{end}' 2>/dev/null >>"${dir}/hostpath-volumes" || true
	fi
	# The node first: its Pods' processes (in its cgroups), the shims, then the daemons.
	stop kubelet kube-proxy
	if [[ -n "${n}" ]]; then
		local i pids
		for ((i = 0; i < 50; i++)); do
			pids="$(pids_of_cgroup "${n}")"
			[[ -z "${pids}" ]] && break
			# shellcheck disable=SC2086
			kill -9 ${pids} 2>/dev/null || true
			sleep 0.1
		done
	fi
	pkill -9 -f "containerd-shim-runc-v2 .*-address ${dir}/containerd.sock" 2>/dev/null || true
	stop containerd
	stop kube-scheduler kube-controller-manager kube-apiserver
	stop etcd
	# The namespaces: once no process is in them, unmounting their files ends them (the tmpfs, the
	# overlays and every Pod's mount with the mount namespace; the veth, its routes and every
	# iptables rule with the network namespace).
	if [[ -d "${dir}/ns" ]]; then
		umount "${dir}/ns/mnt" 2>/dev/null || true
		umount "${dir}/ns/net" 2>/dev/null || true
		umount "${dir}/ns" 2>/dev/null || true
	fi
	if [[ -n "${n}" ]]; then
		ip link del "qmh${n}" 2>/dev/null || true
		local c
		for c in /sys/fs/cgroup/*/"qm-${n}"; do
			[[ -d "${c}" ]] || continue
			find "${c}" -depth -type d -exec rmdir {} + 2>/dev/null || true
			[[ -d "${c}" ]] && log "warning: cgroup ${c} could not be removed"
		done
	fi
	if [[ -f "${dir}/hostpath-volumes" ]]; then
		local v
		while read -r v; do
			[[ "${v}" == /tmp/hostpath_pv/* ]] && rm -rf "${v}"
		done <"${dir}/hostpath-volumes"
		rmdir /tmp/hostpath_pv 2>/dev/null || true
	fi
	# The kubelet's sysctls, when no other cluster runs.
	if [[ -f "${root}/.sysctls" ]] && ! ls "${root}"/*/net-index 2>/dev/null | grep -qv "^${dir}/"; then
		local k v
		while read -r k v; do sysctl -q -w "${k}=${v}" >/dev/null 2>&1 || true; done <"${root}/.sysctls"
		rm -f "${root}/.sysctls"
	fi
	if mountpoint -q "${dir}/ns" 2>/dev/null || grep -qF " ${dir}/" /proc/self/mountinfo; then
		die "mounts under ${dir} remain: $(grep -F " ${dir}/" /proc/self/mountinfo | awk '{print $5}' | tr '\n' ' ')"
	fi
	rm -rf "${dir}"
}

# ---------------------------------------------------------------------------------------------------
# Start-up.

bins() { # the binaries' folders: k8s-bin.sh's last line, node-bin.sh's NAME=FOLDER lines
	BIN="$("${here}/k8s-bin.sh" | tail -n1)"
	while IFS='=' read -r k v; do
		case "${k}" in
		k8s) NODE_K8S="${v}" ;; containerd) CONTAINERD_BIN="${v}" ;; runc) RUNC_BIN="${v}" ;;
		cni) CNI_BIN="${v}" ;; coredns) COREDNS_BIN="${v}" ;;
		esac
	done < <("${here}/node-bin.sh")
	: "${NODE_K8S:?}" "${CONTAINERD_BIN:?}" "${RUNC_BIN:?}" "${CNI_BIN:?}" "${COREDNS_BIN:?}"
}

allocate() { # picks N: 10.N.0.0/16 unused by any address or route here and by any other cluster
	local n
	exec 8>"${root}/.allocate.lock"
	flock 8
	for ((n = 100; n < 200; n++)); do
		if ip -4 addr show | grep -q "inet 10\.${n}\." || ip -4 route show | grep -q "^10\.${n}\."; then continue; fi
		if grep -qx "${n}" "${root}"/*/net-index 2>/dev/null; then continue; fi
		echo "${n}" >"${dir}/net-index"
		flock -u 8
		return
	done
	die "no free 10.N.0.0/16 for N in 100..199"
}

# The daemons do not inherit the script's lock files (fds 6 and 8): a start killed midway must not
# look like one still running (gc).
host_bg() { # host_bg NAME CMD...: a background process in the host's namespaces
	local c="$1"; shift
	setsid "$@" >"${dir}/logs/${c}.log" 2>&1 </dev/null 6>&- 8>&- &
	echo $! >"${dir}/pids/${c}"
}

node_bg() { # node_bg NAME CMD...: a background process in the node's namespaces
	local c="$1"; shift
	setsid nsenter --mount="${dir}/ns/mnt" --net="${dir}/ns/net" -- "$@" >"${dir}/logs/${c}.log" 2>&1 </dev/null 6>&- 8>&- &
	echo $! >"${dir}/pids/${c}"
}

in_node() { nsenter --mount="${dir}/ns/mnt" --net="${dir}/ns/net" -- "$@"; }

wait_for() { # wait_for WHAT SECONDS CMD...: until CMD succeeds; fails naming WHAT and the last log lines
	local what="$1" secs="$2" i; shift 2
	for ((i = 0; i < secs * 10; i++)); do
		if "$@" >/dev/null 2>&1; then return 0; fi
		local c
		for c in "${dir}"/pids/*; do
			if ! running "$(cat "${c}")"; then
				die "$(basename "${c}") exited while waiting for ${what}: $(tail -n 5 "${dir}/logs/$(basename "${c}").log")"
			fi
		done
		sleep 0.1
	done
	die "timed out after ${secs}s waiting for ${what}"
}

pki() {
	local p="${dir}/pki" n="$1"
	mkdir -p "${p}"
	(
		cd "${p}"
		openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -days 30 -subj "/CN=qm-real-cluster-ca" \
			-keyout ca.key -out ca.crt 2>/dev/null
		openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -subj "/CN=kube-apiserver" -keyout apiserver.key -out apiserver.csr 2>/dev/null
		printf 'subjectAltName=IP:10.%s.0.1,IP:10.%s.64.1,IP:127.0.0.1,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local,DNS:localhost\nextendedKeyUsage=serverAuth\n' "${n}" "${n}" >apiserver.ext
		openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 -extfile apiserver.ext -out apiserver.crt 2>/dev/null
		openssl genrsa -out sa.key 2048 2>/dev/null
		openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
		rm -f apiserver.csr apiserver.ext ca.srl
	)
}

kubeconfig() { # kubeconfig FILE USER TOKEN
	cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ${name}
  cluster:
    server: https://10.${N}.0.1:6443
    certificate-authority: ${dir}/pki/ca.crt
users:
- name: $2
  user:
    token: $3
contexts:
- name: $2@${name}
  context: {cluster: ${name}, user: $2}
current-context: $2@${name}
EOF
	chmod 600 "$1"
}

up() {
	if [[ -d "${dir}" ]]; then
		log "a cluster ${name} is left from an earlier run: removing it first"
		teardown
	fi
	bins
	mkdir -p "${dir}"/{logs,pids,bin,ns} "${root}"
	# kubectl beside the cluster, so teardown can read its volumes even after a rebuild elsewhere.
	ln -sf "${BIN}/kubectl" "${dir}/bin/kubectl"
	allocate
	N="$(cat "${dir}/net-index")"
	# A test run's cluster dies with it: gc tears down a cluster whose owner no longer runs.
	if [[ -n "${QM_REAL_CLUSTER_OWNER:-}" ]]; then echo "${QM_REAL_CLUSTER_OWNER}" >"${dir}/owner"; fi
	local host_ip="10.${N}.0.1" node_ip="10.${N}.0.2" node="${name}-node"
	local pod_cidr="10.${N}.128.0/17" svc_cidr="10.${N}.64.0/18" dns_ip="10.${N}.64.10" lo="127.0.${N}.1"
	local start=${SECONDS}

	# The sysctls the kubelet will change, as they were before any cluster ran.
	if [[ ! -f "${root}/.sysctls" ]]; then
		local k
		for k in "${SYSCTLS[@]}"; do echo "${k} $(sysctl -n "${k}")"; done >"${root}/.sysctls.tmp"
		mv "${root}/.sysctls.tmp" "${root}/.sysctls"
	fi

	# The namespaces, as files in the folder: a private bind mount holds them.
	mount --bind "${dir}/ns" "${dir}/ns"
	mount --make-private "${dir}/ns"
	touch "${dir}/ns/net" "${dir}/ns/mnt"
	unshare --net="${dir}/ns/net" true
	mkdir -p "${dir}/overlay"/{etc,var-lib}/{upper,work}
	unshare --mount="${dir}/ns/mnt" --propagation slave sh -ec "
		mount -t tmpfs -o mode=0755 qm-node-run /run
		mount -t overlay qm-node-etc -o lowerdir=/etc,upperdir=${dir}/overlay/etc/upper,workdir=${dir}/overlay/etc/work /etc
		mount -t overlay qm-node-var-lib -o lowerdir=/var/lib,upperdir=${dir}/overlay/var-lib/upper,workdir=${dir}/overlay/var-lib/work /var/lib
	"
	# The veth: the host's end here, the node's end moved into its namespace.
	ip link add "qmh${N}" type veth peer name "qmn${N}"
	ip link set "qmn${N}" netns "${dir}/ns/net"
	ip addr add "${host_ip}/24" dev "qmh${N}"
	ip link set "qmh${N}" up
	in_node ip link set lo up
	in_node ip link set "qmn${N}" name eth0
	in_node ip addr add "${node_ip}/24" dev eth0
	in_node ip link set eth0 up
	# The node's own processes (containerd pulling through a mirror's ClusterIP) need a route for
	# Service addresses before kube-proxy's DNAT: through the host, which never gets them.
	in_node ip route add "${svc_cidr}" via "${host_ip}"
	in_node sysctl -q -w net.ipv4.ip_forward=1
	ip route add "${pod_cidr}" via "${node_ip}"
	ip route add "${svc_cidr}" via "${node_ip}"
	if in_node ip route get 192.0.2.1 >/dev/null 2>&1; then die "the node's network namespace has a route off the machine"; fi

	pki "${N}"
	local admin_token kcm_token sched_token kubelet_token proxy_token
	admin_token="$(openssl rand -hex 24)"; kcm_token="$(openssl rand -hex 24)"; sched_token="$(openssl rand -hex 24)"
	kubelet_token="$(openssl rand -hex 24)"; proxy_token="$(openssl rand -hex 24)"
	cat >"${dir}/pki/tokens.csv" <<EOF
${admin_token},admin,admin,system:masters
${kcm_token},system:kube-controller-manager,kcm
${sched_token},system:kube-scheduler,scheduler
${kubelet_token},system:node:${node},node,system:nodes
${proxy_token},system:kube-proxy,kube-proxy
EOF
	chmod 600 "${dir}/pki/tokens.csv"
	kubeconfig "${dir}/admin.kubeconfig" admin "${admin_token}"
	kubeconfig "${dir}/kcm.kubeconfig" kcm "${kcm_token}"
	kubeconfig "${dir}/scheduler.kubeconfig" scheduler "${sched_token}"
	kubeconfig "${dir}/kubelet.kubeconfig" kubelet "${kubelet_token}"
	kubeconfig "${dir}/kube-proxy.kubeconfig" kube-proxy "${proxy_token}"

	# The control plane, in the host's namespaces.
	host_bg etcd "${BIN}/etcd" --name "${name}" --data-dir "${dir}/etcd" \
		--listen-client-urls "http://${lo}:2379" --advertise-client-urls "http://${lo}:2379" \
		--listen-peer-urls "http://${lo}:2380" --initial-advertise-peer-urls "http://${lo}:2380" \
		--initial-cluster "${name}=http://${lo}:2380" --listen-metrics-urls "http://${lo}:2381" \
		--quota-backend-bytes 2147483648 --unsafe-no-fsync
	host_bg kube-apiserver "${BIN}/kube-apiserver" --etcd-servers "http://${lo}:2379" \
		--bind-address "${host_ip}" --advertise-address "${host_ip}" --secure-port 6443 \
		--tls-cert-file "${dir}/pki/apiserver.crt" --tls-private-key-file "${dir}/pki/apiserver.key" \
		--client-ca-file "${dir}/pki/ca.crt" --token-auth-file "${dir}/pki/tokens.csv" \
		--service-account-key-file "${dir}/pki/sa.pub" --service-account-signing-key-file "${dir}/pki/sa.key" \
		--service-account-issuer https://kubernetes.default.svc.cluster.local \
		--service-cluster-ip-range "${svc_cidr}" --authorization-mode Node,RBAC --allow-privileged=true \
		--enable-admission-plugins NodeRestriction,OwnerReferencesPermissionEnforcement \
		--kubelet-preferred-address-types InternalIP
	local kubectl=("${BIN}/kubectl" --kubeconfig "${dir}/admin.kubeconfig")
	wait_for "the API server" 60 "${kubectl[@]}" get --raw /readyz
	host_bg kube-controller-manager "${BIN}/kube-controller-manager" --kubeconfig "${dir}/kcm.kubeconfig" \
		--bind-address "${lo}" --leader-elect=false --use-service-account-credentials \
		--service-account-private-key-file "${dir}/pki/sa.key" --root-ca-file "${dir}/pki/ca.crt" \
		--allocate-node-cidrs --cluster-cidr "${pod_cidr}" --node-cidr-mask-size 24 \
		--service-cluster-ip-range "${svc_cidr}" --enable-hostpath-provisioner \
		--flex-volume-plugin-dir "${dir}/flexvolume" --controllers '*'
	host_bg kube-scheduler "${BIN}/kube-scheduler" --kubeconfig "${dir}/scheduler.kubeconfig" \
		--bind-address "${lo}" --leader-elect=false

	# The node: containerd, CNI, the kubelet and kube-proxy in its namespaces.
	mkdir -p "${dir}/cni" "${dir}/containerd" "${dir}/kubelet" "${dir}/pod-logs" "${dir}/node-bin"
	ln -sf "${CONTAINERD_BIN}/containerd-shim-runc-v2" "${dir}/node-bin/containerd-shim-runc-v2"
	# The node's /etc/containerd (in its overlay): config.toml with ONE config_path, its certs.d,
	# which containerd 2 reads for CRI pulls and the registry mirror's agent writes.
	in_node mkdir -p /etc/containerd/certs.d
	in_node tee /etc/containerd/config.toml >/dev/null <<EOF
version = 3
root = "${dir}/containerd/root"
state = "${dir}/containerd/state"
disabled_plugins = ["io.containerd.nri.v1.nri", "io.containerd.internal.v1.opt", "io.containerd.image-verifier.v1.bindir"]
[grpc]
  address = "${dir}/containerd.sock"
[ttrpc]
  address = "${dir}/containerd.sock.ttrpc"
[debug]
  level = "info"
[plugins."io.containerd.cri.v1.images"]
  snapshotter = "overlayfs"
[plugins."io.containerd.cri.v1.images".pinned_images]
  sandbox = "docker.io/local/pause:1"
[plugins."io.containerd.cri.v1.images".registry]
  config_path = "/etc/containerd/certs.d"
[plugins."io.containerd.cri.v1.runtime"]
  restrict_oom_score_adj = true
[plugins."io.containerd.cri.v1.runtime".cni]
  bin_dirs = ["${CNI_BIN}"]
  conf_dir = "${dir}/cni"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[plugins."io.containerd.cri.v1.runtime".containerd.runtimes.runc.options]
  BinaryName = "${RUNC_BIN}/runc"
  SystemdCgroup = false
EOF
	cat >"${dir}/cni/10-node.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "qm-node",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "dataDir": "${dir}/cni/ipam", "ranges": [[{"subnet": "10.${N}.128.0/24", "gateway": "10.${N}.128.1"}]],
              "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
EOF
	node_bg containerd env PATH="${dir}/node-bin:${RUNC_BIN}:/usr/sbin:/usr/bin:/sbin:/bin" \
		"${CONTAINERD_BIN}/containerd" --config /etc/containerd/config.toml
	wait_for "containerd" 30 test -S "${dir}/containerd.sock"

	# Images with no registry: the sandbox (pause) and CoreDNS, made from binaries of the cache.
	images
	load "${dir}/images/pause.tar" "${dir}/images/coredns.tar"

	# The kubelet's cgroups, under a root of this cluster's in every hierarchy.
	local c
	for c in /sys/fs/cgroup/*/; do
		[[ -f "${c}cgroup.procs" ]] || continue
		[[ "${c}" == */unified/ ]] && continue
		mkdir -p "${c}qm-${N}"
	done
	echo "search cluster.local" >"${dir}/resolv.conf"
	cat >"${dir}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /qm-${N}
containerRuntimeEndpoint: unix://${dir}/containerd.sock
address: ${node_ip}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
clusterDNS: [${dns_ip}]
clusterDomain: cluster.local
resolvConf: ${dir}/resolv.conf
podLogsDir: ${dir}/pod-logs
failSwapOn: false
oomScoreAdj: 0
volumePluginDir: ${dir}/kubelet/volume-plugins
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
	node_bg kubelet "${NODE_K8S}/kubelet" --config "${dir}/kubelet.yaml" --kubeconfig "${dir}/kubelet.kubeconfig" \
		--hostname-override "${node}" --node-ip "${node_ip}" --root-dir "${dir}/kubelet" --cert-dir "${dir}/kubelet/pki"
	cat >"${dir}/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: ${dir}/kube-proxy.kubeconfig}
hostnameOverride: ${node}
mode: iptables
clusterCIDR: ${pod_cidr}
conntrack: {maxPerCore: 0}
oomScoreAdj: 0
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
EOF
	node_bg kube-proxy "${NODE_K8S}/kube-proxy" --config "${dir}/kube-proxy.yaml"

	# What every cluster has: the default StorageClass, CoreDNS.
	"${kubectl[@]}" apply -f - >/dev/null <<EOF
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: standard
  annotations: {storageclass.kubernetes.io/is-default-class: "true"}
provisioner: kubernetes.io/host-path
reclaimPolicy: Delete
volumeBindingMode: Immediate
EOF
	coredns "${dns_ip}"
	wait_for "the node to be Ready" 60 "${kubectl[@]}" wait --for=condition=Ready "node/${node}" --timeout=1s
	wait_for "CoreDNS to be available" 90 "${kubectl[@]}" -n kube-system wait --for=condition=Available deployment/coredns --timeout=1s
	log "up in $((SECONDS - start))s: node ${node} Ready, CoreDNS serving; kubeconfig: ${dir}/admin.kubeconfig"
	echo "${dir}/admin.kubeconfig"
}

images() {
	mkdir -p "${dir}/images"
	(cd "${here}/.." && GOWORK=off go run ./hack/node-image \
		--out "${dir}/images/pause.tar" --ref docker.io/local/pause:1 --entrypoint /pause \
		--build ./hack/node-image/pause=/pause)
	(cd "${here}/.." && GOWORK=off go run ./hack/node-image \
		--out "${dir}/images/coredns.tar" --ref "docker.io/local/coredns:${COREDNS_BIN##*-}" --entrypoint /coredns \
		--file "${COREDNS_BIN}/coredns=/coredns")
}

load() { # load [--base-name REPOSITORY] TAR...: import into the node's containerd (the CRI's k8s.io namespace)
	local t base=()
	if [[ "${1:-}" == --base-name ]]; then
		# An OCI archive that names only a tag (make image's) is imported as REPOSITORY:TAG.
		base=(--base-name "$2"); shift 2
	fi
	for t in "$@"; do
		[[ -s "${t}" ]] || die "image archive ${t} does not exist"
		in_node "${CONTAINERD_BIN}/ctr" --address "${dir}/containerd.sock" -n k8s.io images import \
			"${base[@]}" --platform "linux/$(go env GOARCH)" "${t}" >>"${dir}/logs/images.log" 2>&1 || die "importing ${t}: $(tail -n 3 "${dir}/logs/images.log")"
	done
}

coredns() {
	local ip="$1"
	"${BIN}/kubectl" --kubeconfig "${dir}/admin.kubeconfig" apply -f - >/dev/null <<EOF
apiVersion: v1
kind: ServiceAccount
metadata: {name: coredns, namespace: kube-system}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: system:coredns}
rules:
- apiGroups: [""]
  resources: [endpoints, services, pods, namespaces]
  verbs: [list, watch]
- apiGroups: [discovery.k8s.io]
  resources: [endpointslices]
  verbs: [list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: system:coredns}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: system:coredns}
subjects: [{kind: ServiceAccount, name: coredns, namespace: kube-system}]
---
apiVersion: v1
kind: ConfigMap
metadata: {name: coredns, namespace: kube-system}
data:
  # No forward: names outside the cluster get SERVFAIL at once (the node has no way out).
  Corefile: |
    .:53 {
        errors
        health :8080
        ready :8181
        kubernetes cluster.local in-addr.arpa ip6.arpa {
            pods insecure
            fallthrough in-addr.arpa ip6.arpa
        }
        cache 30
    }
---
apiVersion: apps/v1
kind: Deployment
metadata: {name: coredns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  replicas: 1
  selector: {matchLabels: {k8s-app: kube-dns}}
  template:
    metadata: {labels: {k8s-app: kube-dns}}
    spec:
      serviceAccountName: coredns
      dnsPolicy: Default
      containers:
      - name: coredns
        image: docker.io/local/coredns:${COREDNS_BIN##*-}
        imagePullPolicy: Never
        args: [-conf, /etc/coredns/Corefile]
        ports:
        - {name: dns, containerPort: 53, protocol: UDP}
        - {name: dns-tcp, containerPort: 53, protocol: TCP}
        readinessProbe: {httpGet: {path: /ready, port: 8181}, periodSeconds: 1}
        livenessProbe: {httpGet: {path: /health, port: 8080}}
        volumeMounts: [{name: config, mountPath: /etc/coredns, readOnly: true}]
      volumes: [{name: config, configMap: {name: coredns}}]
---
apiVersion: v1
kind: Service
metadata: {name: kube-dns, namespace: kube-system, labels: {k8s-app: kube-dns}}
spec:
  clusterIP: ${ip}
  selector: {k8s-app: kube-dns}
  ports:
  - {name: dns, port: 53, protocol: UDP}
  - {name: dns-tcp, port: 53, protocol: TCP}
EOF
}

env_of() {
	[[ -f "${dir}/net-index" ]] || die "no cluster ${name} (hack/real-cluster.sh up ${name})"
	N="$(cat "${dir}/net-index")"
	bins >/dev/null
	cat <<EOF
DIR=${dir}
KUBECONFIG=${dir}/admin.kubeconfig
HOST_IP=10.${N}.0.1
NODE_IP=10.${N}.0.2
NODE_NAME=${name}-node
POD_CIDR=10.${N}.128.0/17
SERVICE_CIDR=10.${N}.64.0/18
DNS_IP=10.${N}.64.10
NODE_NET=${dir}/ns/net
NODE_MNT=${dir}/ns/mnt
CONTAINERD=${dir}/containerd.sock
CTR=${CONTAINERD_BIN}/ctr
BIN=${BIN}
EOF
}

alive() { # alive DIR: an `up` of it holds its lock, its owner runs, or (no owner) a process started from DIR runs
	local d="$1" f pid
	exec 7>>"${d}.lock"
	if ! flock -n 7; then exec 7>&-; return 0; fi
	exec 7>&-
	if [[ -s "${d}/owner" ]]; then
		running "$(cat "${d}/owner")"
		return
	fi
	for f in "${d}"/pids/*; do
		[[ -f "${f}" ]] || continue
		pid="$(cat "${f}")"
		if [[ -n "${pid}" ]] && running "${pid}" && tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null | grep -qF "${d}"; then return 0; fi
	done
	return 1
}

case "${cmd}" in
up)
	mkdir -p "${root}"
	# Held while starting: gc leaves a cluster alone while its processes are being started.
	exec 6>>"${dir}.lock"
	flock 6
	# A failed start leaves nothing running.
	trap 'rc=$?; if ((rc != 0)); then log "start failed; logs in ${dir}/logs (kept in ${dir}.failed-logs)"; rm -rf "${dir}.failed-logs"; cp -r "${dir}/logs" "${dir}.failed-logs" 2>/dev/null || true; teardown || true; fi' EXIT
	up
	trap - EXIT
	;;
down)
	teardown
	rm -rf "${dir}.failed-logs" "${dir}.lock"
	;;
load)
	shift 2 || die "usage: $0 load NAME TAR..."
	[[ -f "${dir}/net-index" ]] || die "no cluster ${name}"
	bins
	load "$@"
	;;
env)
	env_of
	;;
gc)
	for d in "${root}"/*/; do
		d="${d%/}"
		[[ -d "${d}" ]] || continue
		if alive "${d}"; then continue; fi
		"$0" down "$(basename "${d}")"
	done
	;;
*)
	echo "usage: $0 up|down|env [NAME] | load NAME TAR... | gc" >&2
	exit 2
	;;
esac
