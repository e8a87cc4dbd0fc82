package intents

import (
	"context"
	"flag"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	intentv1alpha1 "github.com/quartermaster-dev/quartermaster/api/intent/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/drift"
	"github.com/quartermaster-dev/quartermaster/internal/intent"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

var updateNimbusGoldens = flag.Bool("update", false,
	"rewrite testdata/nimbus/*/golden.yaml from what the controller generates, for review only: "+
		"committed goldens are written from Nimbus's code")

// nimbusExample is one of Nimbus's published example manifests (testdata/nimbus/<dir>/manifest.yaml)
// and what applying it generates (golden.yaml).
type nimbusExample struct {
	dir string
	// refused are the manifest's objects (Kind/name) the API server refuses, with a part of the
	// message: kubectl apply fails for them, in a cluster with Nimbus's CRDs as here.
	refused map[string]string
}

// nimbusExamples are Nimbus's v1alpha1 examples at 67712a9 (testdata/nimbus/README.md says which
// file each reproduces). examples/namespaced/cel-multi-si-sib-namespaced.yaml is left out: spec.cel
// has its own envtest cases (cel_test.go).
var nimbusExamples = []nimbusExample{
	{dir: "namespaced-dns-manipulation"},
	{dir: "namespaced-escape-to-host"},
	{dir: "namespaced-escape-to-host-with-params"},
	{dir: "namespaced-pkg-mgr-exec"},
	{dir: "namespaced-multiple-intents"},
	{dir: "namespaced-exploit-pfa"},
	{dir: "namespaced-coco-workload"},
	{dir: "namespaced-virtual-patch"},
	{dir: "namespaced-net-segment"},
	{dir: "clusterscoped-deny-external-network-access"},
	{dir: "clusterscoped-csib-1-all-ns-selector"},
	{dir: "clusterscoped-csib-1-no-ns-selector", refused: map[string]string{
		"ClusterSecurityIntentBinding/escape-to-host-binding": "selector.nsSelector"}},
	{dir: "clusterscoped-csib-2-match-names"},
	{dir: "clusterscoped-csib-3-exclude-names"},
	{dir: "clusterscoped-csib-4-both-match-exclude-names", refused: map[string]string{
		"ClusterSecurityIntentBinding/escape-to-host-binding": "NsSelector"}},
	{dir: "clusterscoped-escape-to-host-si-csib"},
	{dir: "clusterscoped-escape-to-host-si-csib-with-params"},
	{dir: "clusterscoped-coco-workload"},
	{dir: "clusterscoped-assesstls-default"},
	{dir: "clusterscoped-assesstls-with-schedule"},
	{dir: "clusterscoped-assesstls-with-external-addresses"},
}

// nimbusNamespaces are the namespaces the examples name (besides default), made before any is
// applied, so cluster bindings selecting every namespace reach them too.
var nimbusNamespaces = []string{"ns-1", "ns-2", "ns-3", "prod", "spire", intent.K8TLSNamespace}

// TestNimbusExamples applies each of Nimbus's example manifests as kubectl apply would, waits until
// what the controller generates is exactly the golden objects (every (Cluster)NimbusPolicy and
// engine object, nothing more), compares them whole and removes everything before the next.
//
// The goldens are what Nimbus's core and adapters send for the manifest (read from its code, as its
// Go types serialize it), but for Kyverno's rules, which are as Kyverno 1.19 wants them (each rule
// one operation, no empty blocks, the rule-level failureAction, mutateExistingOnPolicyUpdate and
// generateExisting): Kyverno 1.19 refuses Nimbus's own; each is created as a server dry run before the comparison, so the API
// server's own defaults apply to it as to the controller's object. Server-set metadata (uid,
// resourceVersion, timestamps, managedFields, generation) and status are left out; the golden's
// ownerReferences get the uid of the owner the controller made.
func TestNimbusExamples(t *testing.T) {
	t.Parallel()
	// An API server of its own: "*" selects every namespace there is, the examples install Kyverno,
	// and every generated object on the server is compared and removed.
	f := start(t)
	ctx := context.Background()
	f.installKyverno(t)
	for _, ns := range nimbusNamespaces {
		f.namespace(t, ns)
	}
	must(t, f.c.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: intent.K8TLSNamespace, Name: intent.K8TLSServiceAccount}}))
	// One node with a pod range: NetworkPolicies allow traffic to and from the nodes' ranges.
	must(t, f.c.Create(ctx, &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-1"}, Spec: corev1.NodeSpec{PodCIDR: "10.244.0.0/24"}}))
	eventually(t, "Kyverno and K8TLS detected", func() (bool, string) {
		return f.base.engines.Has(intent.Kyverno) && f.base.engines.Has(intent.K8TLS), ""
	})

	for _, ex := range nimbusExamples {
		// Each removes what it made, passed or not: every example is checked.
		t.Run(ex.dir, func(t *testing.T) { runNimbusExample(t, f, ex) })
	}
}

func runNimbusExample(t *testing.T, f *fixture, ex nimbusExample) {
	dir := filepath.Join("testdata", "nimbus", ex.dir)
	defer f.removeNimbusObjects(t)
	refused := f.applyManifest(t, filepath.Join(dir, "manifest.yaml"))
	for obj, want := range ex.refused {
		if err := refused[obj]; err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: applied with %v, want refused naming %q", obj, err, want)
		}
	}
	for obj, err := range refused {
		if _, ok := ex.refused[obj]; !ok {
			t.Fatalf("%s refused: %v", obj, err)
		}
	}
	goldenPath := filepath.Join(dir, "golden.yaml")
	if *updateNimbusGoldens {
		f.waitSettled(t)
		f.writeGolden(t, goldenPath)
		return
	}
	want := f.expectedObjects(t, readGolden(t, goldenPath))
	testenv.Poll(t, "the generated objects to be the golden ones", 100*time.Millisecond, func() (bool, string) {
		diff := compareObjects(want, f.generatedObjects(t))
		return diff == "", "differences:\n" + diff
	})
}

// applyManifest creates each object of a manifest as kubectl apply does (strict field validation,
// namespaced objects without a namespace in default) and returns the errors of those refused.
func (f *fixture) applyManifest(t *testing.T, path string) map[string]error {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	refused := map[string]error{}
	for _, doc := range splitYAML(b) {
		obj := &unstructured.Unstructured{}
		must(t, yaml.Unmarshal([]byte(doc.body), &obj.Object))
		if len(obj.Object) == 0 {
			continue
		}
		if obj.GetKind() == "SecurityIntentBinding" && obj.GetNamespace() == "" {
			obj.SetNamespace(metav1.NamespaceDefault)
		}
		if err := f.c.Create(context.Background(), obj, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			refused[obj.GetKind()+"/"+obj.GetName()] = err
		}
	}
	return refused
}

// yamlDoc is one document of a multi-document YAML file and the comment lines that lead it.
type yamlDoc struct {
	comments []string
	body     string
}

func splitYAML(b []byte) []yamlDoc {
	var docs []yamlDoc
	for _, part := range strings.Split("\n"+string(b), "\n---") {
		d := yamlDoc{body: part + "\n"} // the line break before --- ends the document's last line
		for _, line := range strings.Split(strings.TrimLeft(part, "\n"), "\n") {
			if !strings.HasPrefix(line, "#") {
				break
			}
			d.comments = append(d.comments, line)
		}
		docs = append(docs, d)
	}
	return docs
}

// goldenObject is one object of a golden file, with the comment that leads it.
type goldenObject struct {
	comments []string
	obj      *unstructured.Unstructured
}

// xNamespaces is a golden document's list of namespaces it stands for, one object in each (an
// object a cluster binding generates in every namespace it selects).
const xNamespaces = "x-namespaces"

func readGolden(t *testing.T, path string) []goldenObject {
	t.Helper()
	b, err := os.ReadFile(path)
	must(t, err)
	var out []goldenObject
	for _, doc := range splitYAML(b) {
		m := map[string]any{}
		must(t, yaml.Unmarshal([]byte(doc.body), &m))
		if len(m) == 0 {
			continue
		}
		namespaces, expand := m[xNamespaces].([]any)
		delete(m, xNamespaces)
		obj := &unstructured.Unstructured{Object: m}
		if !expand {
			out = append(out, goldenObject{doc.comments, obj})
			continue
		}
		for _, ns := range namespaces {
			o := obj.DeepCopy()
			o.SetNamespace(ns.(string))
			out = append(out, goldenObject{doc.comments, o})
		}
	}
	return out
}

// objectKey names an object: Kind, namespace and name.
func objectKey(obj *unstructured.Unstructured) string {
	return obj.GetKind() + " " + client.ObjectKeyFromObject(obj).String()
}

// expectedObjects turns golden objects into what the API server stores for them: each gets its
// owners' uids and is created as a dry run under another name (the API server's defaults apply).
// It waits for the owners to exist.
func (f *fixture) expectedObjects(t *testing.T, golden []goldenObject) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, g := range golden {
		obj := g.obj.DeepCopy()
		refs := obj.GetOwnerReferences()
		for i := range refs {
			owner := &unstructured.Unstructured{}
			owner.SetAPIVersion(refs[i].APIVersion)
			owner.SetKind(refs[i].Kind)
			key := client.ObjectKey{Name: refs[i].Name}
			if !strings.HasPrefix(refs[i].Kind, "Cluster") {
				key.Namespace = obj.GetNamespace()
			}
			eventually(t, "the owner "+refs[i].Kind+" "+key.String()+" of "+objectKey(obj), func() (bool, string) {
				err := f.c.Get(context.Background(), key, owner)
				return err == nil, testenv.ErrString(err)
			})
			refs[i].UID = owner.GetUID()
		}
		obj.SetOwnerReferences(refs)
		if len(refs) > 0 {
			obj.Object = replaceStrings(obj.Object, ownerUID, string(refs[0].UID)).(map[string]any)
		}
		name := obj.GetName()
		obj.SetName("")
		obj.SetGenerateName("golden-")
		if err := f.c.Create(context.Background(), obj, client.DryRunAll, client.FieldValidation(metav1.FieldValidationStrict)); err != nil {
			t.Fatalf("golden %s %s/%s is not a valid object: %v", g.obj.GetKind(), g.obj.GetNamespace(), name, err)
		}
		obj.SetName(name)
		obj.SetGenerateName("")
		stripServerFields(obj)
		out[objectKey(obj)] = obj.Object
	}
	return out
}

// ownerUID stands, in a golden object, for the uid of its (first) owner, where the object holds it
// other than in its ownerReferences (an owner reference in what a Kyverno generate rule creates).
const ownerUID = "$OWNER_UID"

// replaceStrings returns v with every string value old replaced by new.
func replaceStrings(v any, old, new string) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			x[k] = replaceStrings(e, old, new)
		}
	case []any:
		for i, e := range x {
			x[i] = replaceStrings(e, old, new)
		}
	case string:
		if x == old {
			return new
		}
	}
	return v
}

// nimbusKinds are the kinds the controller generates: (Cluster)NimbusPolicies and engine objects.
var nimbusKinds = []schema.GroupVersionKind{
	intentv1alpha1.GroupVersion.WithKind("NimbusPolicy"),
	intentv1alpha1.GroupVersion.WithKind("ClusterNimbusPolicy"),
	intent.KubeArmorPolicyKind, intent.NetworkPolicyKind, intent.KyvernoPolicyKind, intent.KyvernoClusterPolicyKind,
	intent.CronJobKind, intent.ConfigMapKind,
}

// userKinds are the kinds the manifests create.
var userKinds = []schema.GroupVersionKind{
	intentv1alpha1.GroupVersion.WithKind("SecurityIntent"),
	intentv1alpha1.GroupVersion.WithKind("SecurityIntentBinding"),
	intentv1alpha1.GroupVersion.WithKind("ClusterSecurityIntentBinding"),
}

// listAll lists the objects of a kind in every namespace (ConfigMaps: those with an owner only).
func (f *fixture) listAll(t *testing.T, gvk schema.GroupVersionKind) []unstructured.Unstructured {
	t.Helper()
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gvk.GroupVersion().WithKind(gvk.Kind + "List"))
	must(t, f.c.List(context.Background(), list))
	var out []unstructured.Unstructured
	for _, o := range list.Items {
		if gvk == intent.ConfigMapKind && len(o.GetOwnerReferences()) == 0 {
			continue
		}
		out = append(out, o)
	}
	return out
}

// generatedObjects reads every generated object there is, without server-set fields.
func (f *fixture) generatedObjects(t *testing.T) map[string]map[string]any {
	t.Helper()
	out := map[string]map[string]any{}
	for _, gvk := range nimbusKinds {
		for _, o := range f.listAll(t, gvk) {
			obj := o.DeepCopy()
			obj.SetGroupVersionKind(gvk)
			stripServerFields(obj)
			out[objectKey(obj)] = obj.Object
		}
	}
	return out
}

// stripServerFields removes what the API server sets on every object, the status, and the hash
// of what the controller wrote (drift.HashAnnotation: ours, not Nimbus's).
func stripServerFields(obj *unstructured.Unstructured) {
	for _, f := range []string{"uid", "resourceVersion", "creationTimestamp", "managedFields", "generation", "selfLink"} {
		unstructured.RemoveNestedField(obj.Object, "metadata", f)
	}
	unstructured.RemoveNestedField(obj.Object, "metadata", "annotations", drift.HashAnnotation)
	if a, ok, _ := unstructured.NestedMap(obj.Object, "metadata", "annotations"); ok && len(a) == 0 {
		unstructured.RemoveNestedField(obj.Object, "metadata", "annotations")
	}
	delete(obj.Object, "status")
}
