package iam

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	iamv1alpha1 "github.com/quartermaster-dev/quartermaster/api/iam/v1alpha1"
	"github.com/quartermaster-dev/quartermaster/internal/irsa"
	"github.com/quartermaster-dev/quartermaster/internal/testing/testenv"
)

// compatPolicies is an iam-config policies.yaml as the old scripts wrote it: one policy in IAM's
// JSON with bare strings and a single Statement object, one in YAML.
const compatPolicies = `read-reports: {"Version": "2012-10-17", "Statement": {"Effect": "Allow", "Action": "s3:GetObject", "Resource": "arn:aws:s3:::reports/*"}}
send-queue:
  Version: 2012-10-17
  Statement:
  - Sid: Send
    Effect: Allow
    Action: [sqs:SendMessage, sqs:GetQueueUrl]
    Resource: "*"
    Condition:
      Bool: {aws:SecureTransport: true}
`

const compatAttachments = `reporter: [read-reports]
uploader: [send-queue, read-reports]
`

// setCompatData replaces the ConfigMap's data, retrying on conflicts.
func setCompatData(t *testing.T, f *fixture, cm *corev1.ConfigMap, policies, attachments string) {
	t.Helper()
	update(t, f, cm, func(cm *corev1.ConfigMap) {
		cm.Data = map[string]string{KeyPolicies: policies, KeyAttachments: attachments}
	})
}

// waitCompat waits until the ConfigMap's status annotation is state and its message contains
// each of msgs, and returns the ConfigMap.
func waitCompat(t *testing.T, f *fixture, cm *corev1.ConfigMap, state string, msgs ...string) *corev1.ConfigMap {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("ConfigMap %s/%s %s %q", cm.Namespace, cm.Name, state, msgs), func() (bool, string) {
		if err := f.c.Get(context.Background(), client.ObjectKeyFromObject(cm), cm); err != nil {
			return false, err.Error()
		}
		got, msg := cm.Annotations[AnnotationCompatState], cm.Annotations[AnnotationCompatMsg]
		if got != state {
			return false, got + ": " + msg
		}
		for _, m := range msgs {
			if !strings.Contains(msg, m) {
				return false, got + ": " + msg
			}
		}
		return true, ""
	})
	return cm
}

// waitEventNote waits for an Event about obj with reason and a note containing note.
func waitEventNote(t *testing.T, f *fixture, obj client.Object, reason, typ, note string) {
	t.Helper()
	testenv.Eventually(t, fmt.Sprintf("an Event %s %q about %s", reason, note, obj.GetName()), func() (bool, string) {
		var seen []string
		for _, e := range testenv.EventsAbout(t, f.c, obj) {
			if e.Reason == reason && e.Type == typ && strings.Contains(e.Note, note) {
				return true, ""
			}
			seen = append(seen, e.Type+" "+e.Reason+": "+e.Note)
		}
		return false, strings.Join(seen, " | ")
	})
}

// compatObjects lists the namespace's IAMPolicies and IAMServiceAccounts by "Kind/name".
func compatObjects(t *testing.T, f *fixture, ns string) map[string]client.Object {
	t.Helper()
	ctx := context.Background()
	out := map[string]client.Object{}
	pols := &iamv1alpha1.IAMPolicyList{}
	must(t, f.c.List(ctx, pols, client.InNamespace(ns)))
	for i := range pols.Items {
		out["IAMPolicy/"+pols.Items[i].Name] = &pols.Items[i]
	}
	sas := &iamv1alpha1.IAMServiceAccountList{}
	must(t, f.c.List(ctx, sas, client.InNamespace(ns)))
	for i := range sas.Items {
		out["IAMServiceAccount/"+sas.Items[i].Name] = &sas.Items[i]
	}
	return out
}

func policyARNOf(ns, name string) string {
	return "arn:aws:iam::000000000000:policy/quartermaster/test/" + irsa.PolicyName(ns, name)
}

// defaultDocument is the default version's document of an AWS policy ("" if there is none).
func (f *fixture) defaultDocument(arn string) string {
	p := f.awsPolicy(arn)
	if p == nil {
		return ""
	}
	for _, v := range p.Versions {
		if v.IsDefault {
			return v.Document
		}
	}
	return ""
}

func (f *fixture) attached(role string) []string {
	r := f.role(role)
	if r == nil {
		return nil
	}
	return slices.Sorted(slices.Values(r.AttachedPolicies))
}

func testCompat(t *testing.T, f *fixture) {
	ctx := context.Background()
	ns := "t-compat"
	f.namespace(t, ns)
	f.serviceAccount(t, ns, "reporter")
	f.serviceAccount(t, ns, "uploader")
	readARN, sendARN := policyARNOf(ns, "read-reports"), policyARNOf(ns, "send-queue")
	reporterRole, uploaderRole := irsa.RoleName(ns, "reporter"), irsa.RoleName(ns, "uploader")

	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: CompatConfigMap},
		Data:       map[string]string{KeyPolicies: compatPolicies, KeyAttachments: compatAttachments},
	}
	must(t, f.c.Create(ctx, cm))
	cm = waitCompat(t, f, cm, "Ready", "4/4 objects Ready")

	t.Run("the ConfigMap becomes owned, labelled objects and AWS policies and roles", func(t *testing.T) {
		objs := compatObjects(t, f, ns)
		if len(objs) != 4 {
			t.Fatalf("objects %v, want 2 IAMPolicies and 2 IAMServiceAccounts", slices.Sorted(maps.Keys(objs)))
		}
		for key, obj := range objs {
			if obj.GetLabels()[LabelCompat] != CompatConfigMap {
				t.Errorf("%s labels %v", key, obj.GetLabels())
			}
			refs := obj.GetOwnerReferences()
			// No garbage collector in envtest: the cascade is proven by the ownerReference.
			if len(refs) != 1 || refs[0].Kind != "ConfigMap" || refs[0].APIVersion != "v1" || refs[0].Name != CompatConfigMap ||
				refs[0].UID != cm.UID || refs[0].Controller == nil || !*refs[0].Controller ||
				refs[0].BlockOwnerDeletion == nil || !*refs[0].BlockOwnerDeletion {
				t.Errorf("%s ownerReferences %+v, want a controller reference to ConfigMap %s", key, refs, cm.UID)
			}
			if !controllerutil.ContainsFinalizer(obj, Finalizer) {
				t.Errorf("%s has no finalizer", key)
			}
		}
		read := objs["IAMPolicy/read-reports"].(*iamv1alpha1.IAMPolicy)
		want := document("s3:GetObject")
		want.Statement[0].Resource = iamv1alpha1.Resources{"arn:aws:s3:::reports/*"}
		if !equalDocuments(read.Spec.Document, want) || read.Spec.Description != "from ConfigMap t-compat/iam-config" {
			t.Errorf("read-reports spec %+v", read.Spec)
		}
		send := objs["IAMPolicy/send-queue"].(*iamv1alpha1.IAMPolicy)
		if c := send.Spec.Document.Statement[0].Condition; !slices.Equal(c["Bool"]["aws:SecureTransport"], []string{"true"}) {
			t.Errorf("send-queue condition %v", c)
		}
		if sa := objs["IAMServiceAccount/uploader"].(*iamv1alpha1.IAMServiceAccount); sa.Spec.ServiceAccountName != "uploader" ||
			!slices.Equal(sa.Spec.Policies, []string{"read-reports", "send-queue"}) || sa.Spec.CreateServiceAccount {
			t.Errorf("uploader spec %+v", sa.Spec)
		}
		for _, arn := range []string{readARN, sendARN} {
			p := f.awsPolicy(arn)
			if p == nil || len(p.Versions) != 1 {
				t.Fatalf("AWS policy %s = %+v", arn, p)
			}
		}
		if same, err := irsa.Equivalent(f.defaultDocument(sendARN),
			`{"Version":"2012-10-17","Statement":[{"Sid":"Send","Effect":"Allow","Action":["sqs:SendMessage","sqs:GetQueueUrl"],"Resource":"*","Condition":{"Bool":{"aws:SecureTransport":"true"}}}]}`); err != nil || !same {
			t.Errorf("send-queue in AWS: %s (%v)", f.defaultDocument(sendARN), err)
		}
		if got := f.attached(reporterRole); !slices.Equal(got, []string{readARN}) {
			t.Errorf("reporter role attachments %v", got)
		}
		if got := f.attached(uploaderRole); !slices.Equal(got, sorted(readARN, sendARN)) {
			t.Errorf("uploader role attachments %v", got)
		}
		k8sSA := &corev1.ServiceAccount{}
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "uploader"}, k8sSA))
		if !strings.HasSuffix(k8sSA.Annotations[iamv1alpha1.AnnotationRoleARN], "/"+uploaderRole) {
			t.Errorf("ServiceAccount annotations %v", k8sSA.Annotations)
		}
		waitEventNote(t, f, cm, "IAMConfigReady", corev1.EventTypeNormal, "4/4 objects Ready")
		// Objects the cache does not show yet count as not Ready, an object the previous reconcile
		// created is not a name collision, and each state is announced once: the way to Ready is
		// at most one Pending.
		events := map[string]int{}
		for _, e := range testenv.EventsAbout(t, f.c, cm) {
			events[e.Reason]++
			switch {
			case e.Reason == "IAMConfigReady" && e.Note != "4/4 objects Ready",
				e.Reason == "IAMConfigPending" && !strings.Contains(e.Note, "/4 objects Ready; waiting for"),
				e.Reason != "IAMConfigReady" && e.Reason != "IAMConfigPending":
				t.Errorf("Event %s %s: %s", e.Type, e.Reason, e.Note)
			}
		}
		if events["IAMConfigReady"] != 1 || events["IAMConfigPending"] > 1 {
			t.Errorf("Events %v, want at most one Pending, then one Ready", events)
		}
	})

	t.Run("once Ready, the annotation writes cause no further reconciles", func(t *testing.T) {
		must(t, f.c.Get(ctx, client.ObjectKeyFromObject(cm), cm))
		rv, calls := cm.ResourceVersion, f.emu.TotalCalls()
		time.Sleep(2 * time.Second) // the pause is the point: nothing may happen in it
		must(t, f.c.Get(ctx, client.ObjectKeyFromObject(cm), cm))
		if cm.ResourceVersion != rv {
			t.Errorf("ConfigMap written again while Ready: resourceVersion %s → %s (%v)", rv, cm.ResourceVersion, cm.Annotations)
		}
		if n := f.emu.TotalCalls() - calls; n != 0 {
			t.Errorf("%d IAM calls while everything was Ready", n)
		}
	})

	t.Run("a changed document becomes a new policy version", func(t *testing.T) {
		policies := strings.Replace(compatPolicies, `"Action": "s3:GetObject"`, `"Action": ["s3:GetObject", "s3:ListBucket"]`, 1)
		setCompatData(t, f, cm, policies, compatAttachments)
		read := waitReady(t, f, &iamv1alpha1.IAMPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read-reports"}})
		testenv.Eventually(t, "read-reports v2 in AWS", func() (bool, string) {
			d := f.defaultDocument(readARN)
			return strings.Contains(d, "s3:ListBucket"), d
		})
		read = waitReady(t, f, read)
		if read.Status.DefaultVersionID != "v2" || read.Generation != 2 {
			t.Errorf("read-reports generation %d, status %+v", read.Generation, read.Status)
		}
		waitCompat(t, f, cm, "Ready", "4/4 objects Ready")
	})

	t.Run("a changed attachment list attaches and detaches", func(t *testing.T) {
		before := f.emu.State().Calls
		setCompatData(t, f, cm, compatPolicies, "reporter: [send-queue]\nuploader: [send-queue, read-reports]\n")
		testenv.Eventually(t, "reporter's role with send-queue only", func() (bool, string) {
			got := f.attached(reporterRole)
			return slices.Equal(got, []string{sendARN}), fmt.Sprint(got)
		})
		waitCompat(t, f, cm, "Ready", "4/4 objects Ready")
		calls := diffCalls(before, f.emu.State().Calls)
		if calls["AttachRolePolicy"] != 1 || calls["DetachRolePolicy"] != 1 || calls["CreateRole"] != 0 {
			t.Errorf("IAM calls %v, want one attach and one detach", calls)
		}
		// The document went back to the original: one more version.
		testenv.Eventually(t, "read-reports back to s3:GetObject only", func() (bool, string) {
			d := f.defaultDocument(readARN)
			return d != "" && !strings.Contains(d, "s3:ListBucket"), d
		})
	})

	t.Run("a malformed ConfigMap is an Error and changes nothing", func(t *testing.T) {
		good := compatObjects(t, f, ns)
		awsBefore := f.emu.State()
		for _, tc := range []struct {
			name, policies, attachments, problem string
			misspelt                             bool // policies under "policies.yml"
		}{
			{"policies.yaml does not parse", "read-reports: {\"Version\": \"2012-10-17\"\nsend-queue: [", compatAttachments, "policies.yaml: error converting YAML to JSON", false},
			{"a policy name that is not a DNS name", compatPolicies + "Send_All: {\"Version\": \"2012-10-17\", \"Statement\": {\"Effect\": \"Allow\", \"Action\": \"sqs:*\", \"Resource\": \"*\"}}\n",
				"uploader: [send-queue]\n", `policy name "Send_All"`, false},
			{"an attachment naming an undefined policy", compatPolicies, "uploader: [send-queue, nope]\n", `uploader names policy "nope", which policies.yaml does not define`, false},
			{"attachments that are not lists", compatPolicies, "reporter: send-queue\n", "serviceaccount_attachments.yaml: ", false},
			{"a misspelt key", compatPolicies, "uploader: [send-queue]\n", "key policies.yaml is missing (write {} for none); unknown key policies.yml", true},
		} {
			t.Run(tc.name, func(t *testing.T) {
				// Each bad file also drops entries, which a valid file would delete.
				if tc.misspelt {
					update(t, f, cm, func(cm *corev1.ConfigMap) {
						cm.Data = map[string]string{"policies.yml": tc.policies, KeyAttachments: tc.attachments}
					})
				} else {
					setCompatData(t, f, cm, tc.policies, tc.attachments)
				}
				waitCompat(t, f, cm, "Error", "4/4 objects Ready", tc.problem)
				waitEventNote(t, f, cm, "IAMConfigError", corev1.EventTypeWarning, tc.problem)
				now := compatObjects(t, f, ns)
				for key, obj := range good {
					cur, ok := now[key]
					switch {
					case !ok:
						t.Errorf("%s was deleted", key)
					case !cur.GetDeletionTimestamp().IsZero():
						t.Errorf("%s is being deleted", key)
					case cur.GetGeneration() != obj.GetGeneration():
						t.Errorf("%s was changed (generation %d → %d)", key, obj.GetGeneration(), cur.GetGeneration())
					}
				}
				if len(now) != len(good) {
					t.Errorf("objects %v, want %v", slices.Sorted(maps.Keys(now)), slices.Sorted(maps.Keys(good)))
				}
				// Back to a good file between cases, so each Error is a transition with an Event.
				setCompatData(t, f, cm, compatPolicies, "reporter: [send-queue]\nuploader: [send-queue, read-reports]\n")
				waitCompat(t, f, cm, "Ready", "4/4 objects Ready")
			})
		}
		awsAfter := f.emu.State()
		for _, k := range []string{"CreatePolicy", "CreatePolicyVersion", "DeletePolicy", "DeletePolicyVersion", "CreateRole", "DeleteRole", "AttachRolePolicy", "DetachRolePolicy"} {
			if n := awsAfter.Calls[k] - awsBefore.Calls[k]; n != 0 {
				t.Errorf("%d %s calls for malformed ConfigMaps", n, k)
			}
		}
	})

	t.Run("an object of the same name that the ConfigMap does not own is left alone", func(t *testing.T) {
		theirs := waitReady(t, f, f.policy(t, ns, "shared", "s3:ListAllMyBuckets"))
		policies := compatPolicies + "shared: {\"Version\": \"2012-10-17\", \"Statement\": {\"Effect\": \"Allow\", \"Action\": \"*\", \"Resource\": \"*\"}}\n"
		setCompatData(t, f, cm, policies, "reporter: [send-queue]\nuploader: [send-queue, read-reports]\n")
		problem := "IAMPolicy shared exists and was not created from this ConfigMap; it is left alone"
		waitCompat(t, f, cm, "Error", problem)
		waitEventNote(t, f, cm, "IAMConfigError", corev1.EventTypeWarning, problem)
		cur := &iamv1alpha1.IAMPolicy{}
		must(t, f.c.Get(ctx, client.ObjectKeyFromObject(theirs), cur))
		if cur.Generation != theirs.Generation || len(cur.OwnerReferences) != 0 || cur.Labels[LabelCompat] != "" ||
			!equalDocuments(cur.Spec.Document, document("s3:ListAllMyBuckets")) {
			t.Errorf("the other IAMPolicy was changed: %+v", cur.ObjectMeta)
		}
		// Taken out of the file again: Ready, and the other object is still there.
		setCompatData(t, f, cm, compatPolicies, "reporter: [send-queue]\nuploader: [send-queue, read-reports]\n")
		waitCompat(t, f, cm, "Ready", "4/4 objects Ready")
		must(t, f.c.Get(ctx, client.ObjectKeyFromObject(theirs), cur))
		if !cur.DeletionTimestamp.IsZero() {
			t.Error("the other IAMPolicy is being deleted")
		}
		must(t, f.c.Delete(ctx, cur))
		f.waitGone(t, cur)
	})

	t.Run("a policy removed from the file is deleted, in AWS once unused", func(t *testing.T) {
		// An IAMServiceAccount of someone else still uses read-reports.
		f.serviceAccount(t, ns, "other")
		other := waitReady(t, f, f.iamsa(t, ns, "other", iamv1alpha1.IAMServiceAccountSpec{ServiceAccountName: "other", Policies: []string{"read-reports"}}))
		onlySend := "send-queue:" + strings.SplitN(compatPolicies, "send-queue:", 2)[1]
		setCompatData(t, f, cm, onlySend, "reporter: [send-queue]\nuploader: [send-queue]\n")
		read := &iamv1alpha1.IAMPolicy{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "read-reports"}}
		read = waitCondition(t, f, read, ReasonInUse)
		waitCompat(t, f, cm, "Pending", "IAMPolicy read-reports: InUse")
		testenv.Eventually(t, "uploader's role without read-reports", func() (bool, string) {
			got := f.attached(uploaderRole)
			return slices.Equal(got, []string{sendARN}), fmt.Sprint(got)
		})
		if f.awsPolicy(readARN) == nil {
			t.Fatal("read-reports deleted from AWS while in use")
		}
		must(t, f.c.Delete(ctx, other))
		f.waitGone(t, other)
		f.waitGone(t, read)
		if f.awsPolicy(readARN) != nil {
			t.Error("read-reports still in AWS")
		}
		waitCompat(t, f, cm, "Ready", "3/3 objects Ready")
	})

	t.Run("a ConfigMap being deleted is not translated again", func(t *testing.T) {
		// Foreground deletion (or any finalizer) keeps the ConfigMap while the garbage collector
		// deletes its objects: they must not come back.
		update(t, f, cm, func(cm *corev1.ConfigMap) { controllerutil.AddFinalizer(cm, "test.quartermaster.dev/hold") })
		must(t, f.c.Delete(ctx, cm))
		must(t, f.c.Get(ctx, client.ObjectKeyFromObject(cm), cm))
		if cm.DeletionTimestamp.IsZero() {
			t.Fatal("no deletionTimestamp")
		}
		// What the garbage collector would do.
		reporter := &iamv1alpha1.IAMServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "reporter"}}
		must(t, f.c.Delete(ctx, reporter))
		f.waitGone(t, reporter)
		if f.role(reporterRole) != nil {
			t.Error("reporter's role still in AWS")
		}
		// Anything that enqueues the ConfigMap: a Ready change of one of its objects.
		time.Sleep(2 * time.Second) // the pause is the point: nothing may be re-created in it
		err := f.c.Get(ctx, client.ObjectKeyFromObject(reporter), reporter)
		if !apierrors.IsNotFound(err) {
			t.Errorf("IAMServiceAccount reporter re-created for a ConfigMap being deleted (%v)", err)
		}
		update(t, f, cm, func(cm *corev1.ConfigMap) { controllerutil.RemoveFinalizer(cm, "test.quartermaster.dev/hold") })
		f.waitGone(t, cm)
	})

	t.Run("the objects of a deleted ConfigMap clean up AWS when deleted", func(t *testing.T) {
		// envtest has no garbage collector: delete what it would delete.
		objs := compatObjects(t, f, ns)
		if len(objs) != 2 {
			t.Fatalf("objects %v, want IAMPolicy send-queue and IAMServiceAccount uploader", slices.Sorted(maps.Keys(objs)))
		}
		for _, obj := range objs {
			must(t, f.c.Delete(ctx, obj))
		}
		for _, obj := range objs {
			f.waitGone(t, obj)
		}
		if f.role(uploaderRole) != nil || f.awsPolicy(sendARN) != nil {
			t.Error("AWS objects left")
		}
		k8sSA := &corev1.ServiceAccount{}
		must(t, f.c.Get(ctx, client.ObjectKey{Namespace: ns, Name: "uploader"}, k8sSA))
		if _, ok := k8sSA.Annotations[iamv1alpha1.AnnotationRoleARN]; ok {
			t.Errorf("annotation left: %v", k8sSA.Annotations)
		}
	})
}

func sorted(s ...string) []string {
	slices.Sort(s)
	return s
}

// equalDocuments compares two typed documents by their meaning in IAM.
func equalDocuments(a, b iamv1alpha1.PolicyDocument) bool {
	ja, errA := irsa.PolicyDocumentJSON(a)
	jb, errB := irsa.PolicyDocumentJSON(b)
	if errA != nil || errB != nil {
		return false
	}
	same, err := irsa.Equivalent(ja, jb)
	return err == nil && same
}
