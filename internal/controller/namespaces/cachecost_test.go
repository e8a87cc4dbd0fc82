package namespaces

import (
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	kruntime "k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/apimachinery/pkg/util/uuid"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	toolscache "k8s.io/client-go/tools/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/quartermaster-dev/quartermaster/internal/controllers"
	"github.com/quartermaster-dev/quartermaster/internal/drift"
	"github.com/quartermaster-dev/quartermaster/internal/manager"
	"github.com/quartermaster-dev/quartermaster/internal/nsrequest"
)

// maxCacheBytesPerRequest bounds what the manager's cache holds per served request (measured
// 8.8 KB on 2026-11-27 with the defaults of config/manager and the objects as owned.Writer stamps
// them; 11.8 KB while each object's drift hash named its namespace and the request, 9.2 KB before
// objects carried a hash, 17.8 KB before the cache shared what repeats across requests). With Go's collector letting the heap grow to twice the live size,
// RSS grows by about twice this per request.
const maxCacheBytesPerRequest = 9 << 10

// The cache's cost of a served request: its ten objects, as the API server sends them, decoded,
// transformed and stored the way the manager's informers do (same transforms, same indexes).
// CACHECOST_PROFILE=file writes the heap profile of what the cache holds. Not parallel: it
// measures the process's heap.
func TestCacheCostPerServedRequest(t *testing.T) {
	if os.Getenv("CACHECOST_PROFILE") != "" {
		runtime.MemProfileRate = 1
	}
	d, err := nsrequest.LoadDefaults("../../../config/manager/namespace-defaults.yaml")
	if err != nil {
		t.Fatal(err)
	}
	o := &Options{RequestsNamespace: "requests"}
	// The cache as the manager builds it: same transforms, same informers and indexes.
	opts, _ := manager.CacheOptions([]controllers.Controller{o.controller()})
	transforms := map[string]toolscache.TransformFunc{}
	for obj, by := range opts.ByObject {
		if by.Transform != nil {
			transforms[fmt.Sprintf("%T", obj)] = by.Transform
		}
	}
	codec := protobuf.NewSerializer(clientgoscheme.Scheme, clientgoscheme.Scheme)
	const n = 1000
	var wire [][]byte
	var kinds []string
	examples := map[string]kruntime.Object{}
	for i := range n {
		for _, obj := range servedObjects("requests", i, d) {
			gvks, _, err := clientgoscheme.Scheme.ObjectKinds(obj)
			if err != nil {
				t.Fatal(err)
			}
			obj.GetObjectKind().SetGroupVersionKind(gvks[0])
			b, err := kruntime.Encode(codec, obj)
			if err != nil {
				t.Fatal(err)
			}
			kind := fmt.Sprintf("%T", obj)
			examples[kind] = obj
			wire, kinds = append(wire, b), append(kinds, kind)
		}
	}

	stores := map[string]toolscache.Indexer{}
	for kind, obj := range examples {
		stores[kind] = opts.NewInformer(nil, obj, 0, toolscache.Indexers{toolscache.NamespaceIndex: toolscache.MetaNamespaceIndexFunc}).GetIndexer()
	}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i, b := range wire {
		obj, _, err := codec.Decode(b, nil, nil)
		if err != nil {
			t.Fatal(err)
		}
		transform := transforms[kinds[i]]
		if transform == nil {
			transform = opts.DefaultTransform
		}
		cached, err := transform(obj)
		if err != nil {
			t.Fatal(err)
		}
		if err := stores[kinds[i]].Add(cached); err != nil {
			t.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	if path := os.Getenv("CACHECOST_PROFILE"); path != "" {
		f, err := os.Create(path)
		if err != nil {
			t.Fatal(err)
		}
		if err := pprof.WriteHeapProfile(f); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	runtime.KeepAlive(stores)
	runtime.KeepAlive(wire)

	per := float64(after.HeapAlloc-before.HeapAlloc) / n
	t.Logf("the cache holds %.0f bytes per served request", per)
	if per > maxCacheBytesPerRequest {
		t.Errorf("the cache holds %.0f bytes per served request, more than %d", per, maxCacheBytesPerRequest)
	}
}

// servedObjects returns what the API server holds for the i-th served request, as it sends it: the
// request, its Secret, the Namespace and the objects made in it, each with a UID, a
// resourceVersion, a creation time and managedFields.
func servedObjects(requestsNS string, i int, d *nsrequest.Defaults) []client.Object {
	name := fmt.Sprintf("team-%05d", i)
	now := metav1.NewTime(time.Date(2026, 11, 24, 12, 0, 0, 0, time.UTC))
	rv := 1000 + i*20
	stamp := func(o client.Object) {
		rv++
		o.SetUID(uuid.NewUUID())
		o.SetResourceVersion(fmt.Sprint(rv))
		o.SetCreationTimestamp(now)
		o.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: "quartermaster", Operation: metav1.ManagedFieldsOperationUpdate,
			APIVersion: "v1", Time: &now, FieldsType: "FieldsV1",
			FieldsV1: metav1.NewFieldsV1(`{"f:metadata":{"f:labels":{"f:quartermaster.dev/managed-by":{},"f:quartermaster.dev/request":{}}}}`)}})
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: requestsNS, Annotations: map[string]string{
		nsrequest.AnnotationStatus: "Ready", nsrequest.AnnotationReason: "Served",
		nsrequest.AnnotationMessage: "namespace " + name + " is ready; its kubeconfig is in Secret " + requestsNS + "/" + name + " (server https://10.0.0.1:6443)",
	}}}
	stamp(cm)
	ns := nsrequest.Namespace(requestsNS, &nsrequest.Request{Namespace: name}, cm.UID, now.Time)
	ns.Labels[corev1.LabelMetadataName] = name
	ns.Spec.Finalizers = []corev1.FinalizerName{corev1.FinalizerKubernetes}
	ns.Status.Phase = corev1.NamespaceActive
	stamp(ns)
	cm.OwnerReferences = []metav1.OwnerReference{{APIVersion: "v1", Kind: "Namespace", Name: name, UID: ns.UID}}
	secret := &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: requestsNS, Labels: nsrequest.Labels(requestsNS, name), Annotations: map[string]string{
			nsrequest.AnnotationRequest:        requestsNS + "/" + name,
			nsrequest.AnnotationTokenIssuedAt:  now.Format(time.RFC3339),
			nsrequest.AnnotationTokenExpiresAt: now.Add(24 * time.Hour).Format(time.RFC3339),
			nsrequest.AnnotationTokenSAUID:     string(uuid.NewUUID()),
		}},
		// Sizes of a real one; the summary keeps none of it.
		Data: map[string][]byte{keyToken: make([]byte, 1100), keyCA: make([]byte, 1100), keyNamespace: []byte(name), keyKubeconfig: make([]byte, 3500)},
	}
	if err := drift.Stamp(secret); err != nil { // written by owned.Writer.Ensure
		panic(err)
	}
	stamp(secret)
	objs := []client.Object{cm, ns, secret}
	for _, o := range nsrequest.NamespaceObjects(requestsNS, name, &d.Profile) {
		if err := drift.Stamp(o); err != nil { // written by owned.Writer.Ensure
			panic(err)
		}
		stamp(o)
		objs = append(objs, o)
	}
	return objs
}
