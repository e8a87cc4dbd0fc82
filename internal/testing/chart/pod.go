package chart

import (
	"context"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// Process is what a kubelet would run for a Pod's container, made runnable on this machine: the
// container's args with $(VAR) expanded, its environment resolved (values, the downward API,
// Secret and ConfigMap keys), its ConfigMap and Secret volumes written under Root with every mount
// path in args and env moved there, and each containerPort given a free loopback address.
type Process struct {
	Args []string
	Env  []string
	// Root holds the mounted volumes: a file mounted at /etc/x/f is Root/etc/x/f.
	Root string
	// Ports maps a containerPort's name (or number) to the loopback address its flag now binds.
	Ports map[string]string
	// ServiceAccount is the pod's ServiceAccount (the process authenticates as it).
	ServiceAccount string
	// Skipped lists the volumes not materialised and why (the ServiceAccount token volume: the
	// process gets a kubeconfig with a token of ServiceAccount instead).
	Skipped []string
}

var varRef = regexp.MustCompile(`\$\(([A-Za-z_][A-Za-z0-9_]*)\)`)

// ProcessFor turns the named container of pod into a Process, reading the Secrets and ConfigMaps it
// refers to with c (as the kubelet would) and writing its volumes under root.
func ProcessFor(ctx context.Context, c client.Client, pod *corev1.Pod, container, root string) (*Process, error) {
	var ctr *corev1.Container
	for i := range pod.Spec.Containers {
		if pod.Spec.Containers[i].Name == container {
			ctr = &pod.Spec.Containers[i]
		}
	}
	if ctr == nil {
		return nil, fmt.Errorf("pod %s has no container %q", pod.Name, container)
	}
	if len(ctr.Command) > 0 {
		return nil, fmt.Errorf("container %s sets a command %v: only the image's entrypoint (the binary) can run here", container, ctr.Command)
	}
	p := &Process{Root: root, Ports: map[string]string{}, ServiceAccount: pod.Spec.ServiceAccountName}

	// Volumes, by name, as files under root at each mount path.
	mounts := map[string]string{} // mountPath → path under root
	for _, m := range ctr.VolumeMounts {
		var vol *corev1.Volume
		for i := range pod.Spec.Volumes {
			if pod.Spec.Volumes[i].Name == m.Name {
				vol = &pod.Spec.Volumes[i]
			}
		}
		if vol == nil {
			return nil, fmt.Errorf("mount %s names no volume", m.Name)
		}
		dir := filepath.Join(root, m.MountPath)
		files, err := volumeFiles(ctx, c, pod.Namespace, vol)
		if err != nil {
			return nil, err
		}
		if files == nil {
			p.Skipped = append(p.Skipped, fmt.Sprintf("%s at %s", vol.Name, m.MountPath))
			continue
		}
		if m.SubPath != "" {
			data, ok := files[m.SubPath]
			if !ok {
				return nil, fmt.Errorf("volume %s has no %s", vol.Name, m.SubPath)
			}
			files = map[string][]byte{"": data}
		}
		for name, data := range files {
			path := filepath.Join(dir, name)
			if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
				return nil, err
			}
			if err := os.WriteFile(path, data, 0o444); err != nil {
				return nil, err
			}
		}
		mounts[m.MountPath] = dir
	}
	// Longest mount path first, so /etc/a/b is moved before /etc/a.
	var paths []string
	for mp := range mounts {
		paths = append(paths, mp)
	}
	sort.Slice(paths, func(i, j int) bool { return len(paths[i]) > len(paths[j]) })
	relocate := func(s string) string {
		for _, mp := range paths {
			s = strings.ReplaceAll(s, mp, mounts[mp])
		}
		return s
	}

	// Environment, in order: envFrom first, then env (which wins), each value able to refer to
	// the ones before it with $(NAME), as the kubelet expands them.
	env := map[string]string{}
	var order []string
	set := func(k, v string) {
		if _, ok := env[k]; !ok {
			order = append(order, k)
		}
		env[k] = v
	}
	for _, from := range ctr.EnvFrom {
		data, err := sourceData(ctx, c, pod.Namespace, from.SecretRef, from.ConfigMapRef)
		if err != nil {
			return nil, err
		}
		for k, v := range data {
			set(from.Prefix+k, v)
		}
	}
	expand := func(s string) string {
		return varRef.ReplaceAllStringFunc(s, func(ref string) string {
			if v, ok := env[ref[2:len(ref)-1]]; ok {
				return v
			}
			return ref
		})
	}
	for _, e := range ctr.Env {
		switch {
		case e.ValueFrom == nil:
			set(e.Name, relocate(expand(e.Value)))
		case e.ValueFrom.FieldRef != nil:
			v, err := podField(pod, e.ValueFrom.FieldRef.FieldPath)
			if err != nil {
				return nil, err
			}
			set(e.Name, v)
		case e.ValueFrom.SecretKeyRef != nil || e.ValueFrom.ConfigMapKeyRef != nil:
			var data map[string]string
			var key string
			var err error
			if r := e.ValueFrom.SecretKeyRef; r != nil {
				key = r.Key
				data, err = sourceData(ctx, c, pod.Namespace, &corev1.SecretEnvSource{LocalObjectReference: r.LocalObjectReference}, nil)
			} else {
				r := e.ValueFrom.ConfigMapKeyRef
				key = r.Key
				data, err = sourceData(ctx, c, pod.Namespace, nil, &corev1.ConfigMapEnvSource{LocalObjectReference: r.LocalObjectReference})
			}
			if err != nil {
				return nil, err
			}
			v, ok := data[key]
			if !ok {
				return nil, fmt.Errorf("env %s: no key %s", e.Name, key)
			}
			set(e.Name, v)
		default:
			return nil, fmt.Errorf("env %s: this harness does not resolve %v", e.Name, e.ValueFrom)
		}
	}
	for _, k := range order {
		p.Env = append(p.Env, k+"="+env[k])
	}

	// Ports: a flag whose value ends in :PORT of a containerPort binds a free loopback address.
	free := map[int32]string{}
	for _, port := range ctr.Ports {
		addr, err := freeAddr()
		if err != nil {
			return nil, err
		}
		free[port.ContainerPort] = addr
		p.Ports[strconv.Itoa(int(port.ContainerPort))] = addr
		if port.Name != "" {
			p.Ports[port.Name] = addr
		}
	}
	for _, a := range ctr.Args {
		a = relocate(expand(a))
		for port, addr := range free {
			if k, v, ok := strings.Cut(a, "="); ok && strings.HasPrefix(k, "--") && v == ":"+strconv.Itoa(int(port)) {
				a = k + "=" + addr
			}
		}
		p.Args = append(p.Args, a)
	}
	return p, nil
}

// ProbeAddr returns the loopback address and path of an HTTP probe.
func (p *Process) ProbeAddr(probe *corev1.Probe) (string, error) {
	if probe == nil || probe.HTTPGet == nil {
		return "", fmt.Errorf("not an HTTP probe")
	}
	addr, ok := p.Ports[probe.HTTPGet.Port.String()]
	if !ok {
		return "", fmt.Errorf("probe port %s is no containerPort", probe.HTTPGet.Port.String())
	}
	return "http://" + addr + probe.HTTPGet.Path, nil
}

func podField(pod *corev1.Pod, path string) (string, error) {
	switch path {
	case "metadata.namespace":
		return pod.Namespace, nil
	case "metadata.name":
		return pod.Name, nil
	case "spec.serviceAccountName":
		return pod.Spec.ServiceAccountName, nil
	case "spec.nodeName":
		return pod.Spec.NodeName, nil
	}
	return "", fmt.Errorf("this harness does not resolve the field %s", path)
}

// volumeFiles returns a ConfigMap's or Secret's volume as file name → content, or nil for volumes
// that are not materialised (the projected ServiceAccount token).
func volumeFiles(ctx context.Context, c client.Client, namespace string, v *corev1.Volume) (map[string][]byte, error) {
	var data map[string][]byte
	var items []corev1.KeyToPath
	switch {
	case v.ConfigMap != nil:
		cm := &corev1.ConfigMap{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: v.ConfigMap.Name}, cm); err != nil {
			return nil, err
		}
		data = map[string][]byte{}
		for k, s := range cm.Data {
			data[k] = []byte(s)
		}
		for k, b := range cm.BinaryData {
			data[k] = b
		}
		items = v.ConfigMap.Items
	case v.Secret != nil:
		s := &corev1.Secret{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: v.Secret.SecretName}, s); err != nil {
			return nil, err
		}
		data = s.Data
		items = v.Secret.Items
	case v.Projected != nil:
		for _, src := range v.Projected.Sources {
			if src.ServiceAccountToken != nil {
				return nil, nil
			}
		}
		return nil, fmt.Errorf("volume %s: this harness does not materialise projected volumes", v.Name)
	default:
		return nil, fmt.Errorf("volume %s: this harness materialises ConfigMap and Secret volumes only", v.Name)
	}
	if len(items) == 0 {
		return data, nil
	}
	out := map[string][]byte{}
	for _, it := range items {
		b, ok := data[it.Key]
		if !ok {
			return nil, fmt.Errorf("volume %s has no key %s", v.Name, it.Key)
		}
		out[it.Path] = b
	}
	return out, nil
}

func sourceData(ctx context.Context, c client.Client, namespace string, secret *corev1.SecretEnvSource, cm *corev1.ConfigMapEnvSource) (map[string]string, error) {
	out := map[string]string{}
	switch {
	case secret != nil:
		s := &corev1.Secret{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: secret.Name}, s); err != nil {
			return nil, err
		}
		for k, v := range s.Data {
			out[k] = string(v)
		}
	case cm != nil:
		m := &corev1.ConfigMap{}
		if err := c.Get(ctx, types.NamespacedName{Namespace: namespace, Name: cm.Name}, m); err != nil {
			return nil, err
		}
		for k, v := range m.Data {
			out[k] = v
		}
	}
	return out, nil
}

func freeAddr() (string, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer l.Close()
	return l.Addr().String(), nil
}
