package main

// The `kubelet` role stands in for the kubelet of one fake node, for the parts of kubelet that a DRA
// driver talks to: plugin registration over the registry directory, NodePrepareResources before a
// pod starts, NodeUnprepareResources after it stops, and the wiping of the node's ResourceSlices at
// start-up. It uses k8s.io/kubelet's generated gRPC clients, so a plugin whose protos differ from
// kubelet's fails here exactly as it would against a real kubelet.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/cache"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/client-go/util/workqueue"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
)

// callTimeout mirrors kubelet's per-RPC deadline for the DRA service.
const callTimeout = 45 * time.Second

// podClaims remembers what was prepared for a pod, so it can be unprepared after the pod and
// even its claims are gone from the apiserver.
type podClaims struct {
	key    string
	claims []preparedClaim
}

type kubelet struct {
	node        string
	registryDir string
	client      kubernetes.Interface
	rec         *recorder
	queue       workqueue.TypedRateLimitingInterface[string]
	podLister   cache.Indexer

	mu        sync.Mutex
	plugins   map[string]*draPlugin         // driver name -> instance
	rejected  map[string]time.Time          // registration socket -> mtime when it was rejected
	prepared  map[types.UID]*podClaims      // pod UID -> prepared claims
	claimPods map[string]map[types.UID]bool // claim UID -> pods using it
}

func runKubelet(args []string) int {
	fs := flag.NewFlagSet("kubelet", flag.ContinueOnError)
	kubeconfig := fs.String("kubeconfig", "", "kubeconfig of the control plane (required)")
	node := fs.String("node-name", "", "name of the Node this stand-in serves (required)")
	registryDir := fs.String("registry-dir", "", "plugin registry directory to watch (required; kubelet's plugins_registry)")
	results := fs.String("results", "", "JSON-lines file that receives every registration, prepare and unprepare (required)")
	noWipe := fs.Bool("no-wipe", false, "do not delete the node's ResourceSlices at start (the real kubelet always does)")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	for name, v := range map[string]string{"--kubeconfig": *kubeconfig, "--node-name": *node, "--registry-dir": *registryDir, "--results": *results} {
		if v == "" {
			fmt.Fprintf(os.Stderr, "kubelet: %s is required\n", name)
			return 2
		}
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet: kubeconfig: %v\n", err)
		return 1
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet: client: %v\n", err)
		return 1
	}
	if err := os.MkdirAll(*registryDir, 0o755); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet: %v\n", err)
		return 1
	}
	f, err := os.OpenFile(*results, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		fmt.Fprintf(os.Stderr, "kubelet: results file: %v\n", err)
		return 1
	}
	defer f.Close()

	ctx, cancel := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer cancel()
	k := &kubelet{
		node:        *node,
		registryDir: *registryDir,
		client:      client,
		rec:         &recorder{f: f, node: *node},
		queue: workqueue.NewTypedRateLimitingQueue(workqueue.NewTypedItemExponentialFailureRateLimiter[string](
			100*time.Millisecond, 5*time.Second)),
		plugins:   map[string]*draPlugin{},
		rejected:  map[string]time.Time{},
		prepared:  map[types.UID]*podClaims{},
		claimPods: map[string]map[types.UID]bool{},
	}
	if !*noWipe {
		if err := k.wipeSlices(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "kubelet: wiping ResourceSlices: %v\n", err)
			return 1
		}
	}
	k.rec.record(event{Event: "started"})
	return k.run(ctx)
}

// wipeSlices deletes every ResourceSlice of this node, of every driver, as kubelet does at
// start-up: the plugins are expected to notice and publish again.
func (k *kubelet) wipeSlices(ctx context.Context) error {
	sel := fields.OneTermEqualSelector("spec.nodeName", k.node).String()
	list, err := k.client.ResourceV1().ResourceSlices().List(ctx, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return err
	}
	err = k.client.ResourceV1().ResourceSlices().DeleteCollection(ctx, metav1.DeleteOptions{}, metav1.ListOptions{FieldSelector: sel})
	if err != nil {
		return err
	}
	k.rec.record(event{Event: "wiped-slices", Deleted: len(list.Items)})
	return nil
}

func (k *kubelet) run(ctx context.Context) int {
	factory := informers.NewSharedInformerFactoryWithOptions(k.client, 0, informers.WithTweakListOptions(func(o *metav1.ListOptions) {
		o.FieldSelector = fields.OneTermEqualSelector("spec.nodeName", k.node).String()
	}))
	podInformer := factory.Core().V1().Pods().Informer()
	k.podLister = podInformer.GetIndexer()
	enqueue := func(obj any) {
		if key, err := cache.DeletionHandlingMetaNamespaceKeyFunc(obj); err == nil {
			k.queue.Add(key)
		}
	}
	_, _ = podInformer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    enqueue,
		UpdateFunc: func(_, obj any) { enqueue(obj) },
		DeleteFunc: enqueue,
	})
	factory.Start(ctx.Done())
	if !cache.WaitForCacheSync(ctx.Done(), podInformer.HasSynced) {
		return 1
	}
	go wait.UntilWithContext(ctx, k.scanRegistry, 200*time.Millisecond)
	go k.heartbeat(ctx)
	go func() {
		<-ctx.Done()
		k.queue.ShutDown()
	}()
	var wg sync.WaitGroup
	for range 2 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for k.processNext(ctx) {
			}
		}()
	}
	wg.Wait()
	k.mu.Lock()
	for _, p := range k.plugins {
		_ = p.conn.Close()
	}
	k.mu.Unlock()
	return 0
}

func (k *kubelet) processNext(ctx context.Context) bool {
	key, quit := k.queue.Get()
	if quit {
		return false
	}
	defer k.queue.Done(key)
	if err := k.sync(ctx, key); err != nil {
		fmt.Fprintf(os.Stderr, "kubelet: %s: %v (retrying)\n", key, err)
		k.queue.AddRateLimited(key)
		return true
	}
	k.queue.Forget(key)
	return true
}

func (k *kubelet) sync(ctx context.Context, key string) error {
	obj, exists, err := k.podLister.GetByKey(key)
	if err != nil {
		return err
	}
	if !exists {
		return k.unprepareGone(ctx, key)
	}
	pod := obj.(*corev1.Pod)
	if pod.DeletionTimestamp != nil {
		if err := k.unpreparePod(ctx, pod.UID); err != nil {
			return err
		}
		// The pod's containers are "stopped": finish the deletion the way kubelet's status
		// manager does once a pod has terminated.
		zero := int64(0)
		err := k.client.CoreV1().Pods(pod.Namespace).Delete(ctx, pod.Name, metav1.DeleteOptions{
			GracePeriodSeconds: &zero, Preconditions: &metav1.Preconditions{UID: &pod.UID}})
		if err != nil && !apierrors.IsNotFound(err) && !apierrors.IsConflict(err) {
			return err
		}
		return nil
	}
	if len(pod.Spec.ResourceClaims) == 0 {
		return k.markRunning(ctx, pod, nil)
	}
	// Like kubelet's claim cache: once prepared, later syncs of the pod (our own status update
	// among them) do not call the plugin again. Only a restarted stand-in, which has lost this
	// memory as kubelet loses its "prepared" flags, prepares running pods again.
	k.mu.Lock()
	done := k.prepared[pod.UID]
	k.mu.Unlock()
	if done != nil {
		return k.markRunning(ctx, pod, done.claims)
	}
	claims, err := k.preparePod(ctx, pod)
	if err != nil {
		k.rec.record(event{Event: "prepare-failed", Pod: key, PodUID: string(pod.UID), Error: err.Error()})
		return err
	}
	return k.markRunning(ctx, pod, claims)
}

// unprepareGone handles a pod that vanished without our seeing its deletion timestamp (force
// deletion): its claims are unprepared from what was remembered at prepare time.
func (k *kubelet) unprepareGone(ctx context.Context, key string) error {
	k.mu.Lock()
	var uids []types.UID
	for uid, pc := range k.prepared {
		if pc.key == key {
			uids = append(uids, uid)
		}
	}
	k.mu.Unlock()
	for _, uid := range uids {
		if err := k.unpreparePod(ctx, uid); err != nil {
			return err
		}
	}
	return nil
}

// preparePod does what kubelet does before creating a pod sandbox: resolve every claim of the
// pod, check that it is allocated and reserved for the pod, and call each driver once with all of
// the pod's claims that it has results in.
func (k *kubelet) preparePod(ctx context.Context, pod *corev1.Pod) ([]preparedClaim, error) {
	type claimRef struct {
		namespace, name, uid string
	}
	byDriver := map[string][]claimRef{}
	for _, pc := range pod.Spec.ResourceClaims {
		name := ""
		if pc.ResourceClaimName != nil {
			name = *pc.ResourceClaimName
		} else {
			for _, st := range pod.Status.ResourceClaimStatuses {
				if st.Name == pc.Name && st.ResourceClaimName != nil {
					name = *st.ResourceClaimName
				}
			}
		}
		if name == "" {
			return nil, fmt.Errorf("pod claim %q has no generated ResourceClaim yet", pc.Name)
		}
		claim, err := k.client.ResourceV1().ResourceClaims(pod.Namespace).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return nil, fmt.Errorf("get ResourceClaim %s/%s: %w", pod.Namespace, name, err)
		}
		if pc.ResourceClaimTemplateName != nil && !metav1.IsControlledBy(claim, pod) {
			return nil, fmt.Errorf("ResourceClaim %s/%s was not generated for this pod", pod.Namespace, name)
		}
		if claim.Status.Allocation == nil {
			return nil, fmt.Errorf("ResourceClaim %s/%s is not allocated", pod.Namespace, name)
		}
		reserved := false
		for _, r := range claim.Status.ReservedFor {
			if r.UID == pod.UID {
				reserved = true
			}
		}
		if !reserved {
			return nil, fmt.Errorf("pod is not in status.reservedFor of ResourceClaim %s/%s", pod.Namespace, name)
		}
		drivers := map[string]bool{}
		for _, r := range claim.Status.Allocation.Devices.Results {
			drivers[r.Driver] = true
		}
		for d := range drivers {
			byDriver[d] = append(byDriver[d], claimRef{pod.Namespace, name, string(claim.UID)})
		}
	}
	var out []preparedClaim
	drivers := make([]string, 0, len(byDriver))
	for d := range byDriver {
		drivers = append(drivers, d)
	}
	sort.Strings(drivers)
	for _, driver := range drivers {
		p, err := k.pluginFor(driver)
		if err != nil {
			return nil, err
		}
		req := make([]*drav1.Claim, 0, len(byDriver[driver]))
		for _, c := range byDriver[driver] {
			req = append(req, &drav1.Claim{Namespace: c.namespace, Name: c.name, Uid: c.uid})
		}
		k.rec.record(event{Event: "prepare-started", Pod: pod.Namespace + "/" + pod.Name, PodUID: string(pod.UID), Driver: driver,
			Claims: claimsOf(req, driver)})
		resp, err := p.prepare(ctx, req)
		if err != nil {
			return nil, fmt.Errorf("NodePrepareResources on %s: %w", driver, err)
		}
		var errs []error
		for uid := range resp {
			found := false
			for _, c := range req {
				found = found || c.Uid == uid
			}
			if !found {
				errs = append(errs, fmt.Errorf("%s returned a result for unknown claim UID %s", driver, uid))
			}
		}
		for _, c := range req {
			r, ok := resp[c.Uid]
			if !ok {
				errs = append(errs, fmt.Errorf("%s skipped ResourceClaim %s/%s", driver, c.Namespace, c.Name))
				continue
			}
			if r.GetError() != "" {
				errs = append(errs, fmt.Errorf("%s: ResourceClaim %s/%s: %s", driver, c.Namespace, c.Name, r.GetError()))
				continue
			}
			pc := preparedClaim{Namespace: c.Namespace, Name: c.Name, UID: c.Uid, Driver: driver, Devices: []preparedDevice{}}
			for _, d := range r.GetDevices() {
				if d.GetPoolName() == "" || d.GetDeviceName() == "" {
					errs = append(errs, fmt.Errorf("%s: ResourceClaim %s/%s: device without pool or device name", driver, c.Namespace, c.Name))
				}
				pc.Devices = append(pc.Devices, preparedDevice{
					RequestNames: nonNil(d.GetRequestNames()), PoolName: d.GetPoolName(), DeviceName: d.GetDeviceName(),
					CDIDeviceIDs: nonNil(d.GetCdiDeviceIds()), ShareID: d.GetShareId()})
			}
			out = append(out, pc)
		}
		if len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
	}
	k.mu.Lock()
	k.prepared[pod.UID] = &podClaims{key: pod.Namespace + "/" + pod.Name, claims: out}
	for _, c := range out {
		if k.claimPods[c.UID] == nil {
			k.claimPods[c.UID] = map[types.UID]bool{}
		}
		k.claimPods[c.UID][pod.UID] = true
	}
	k.mu.Unlock()
	k.rec.record(event{Event: "prepared", Pod: pod.Namespace + "/" + pod.Name, PodUID: string(pod.UID), Claims: out})
	return out, nil
}

// unpreparePod calls NodeUnprepareResources for the claims of the pod that no other pod on this
// node still uses, as kubelet does when the last consumer of a claim terminates.
func (k *kubelet) unpreparePod(ctx context.Context, podUID types.UID) error {
	k.mu.Lock()
	pc := k.prepared[podUID]
	k.mu.Unlock()
	if pc == nil {
		return nil
	}
	byDriver := map[string][]*drav1.Claim{}
	k.mu.Lock()
	for _, c := range pc.claims {
		users := k.claimPods[c.UID]
		if len(users) == 1 && users[podUID] || len(users) == 0 {
			byDriver[c.Driver] = append(byDriver[c.Driver], &drav1.Claim{Namespace: c.Namespace, Name: c.Name, Uid: c.UID})
		}
	}
	k.mu.Unlock()
	var unprepared []preparedClaim
	for driver, claims := range byDriver {
		p, err := k.pluginFor(driver)
		if err != nil {
			return err
		}
		resp, err := p.unprepare(ctx, claims)
		if err != nil {
			k.rec.record(event{Event: "unprepare-failed", Pod: pc.key, PodUID: string(podUID), Driver: driver, Error: err.Error()})
			return fmt.Errorf("NodeUnprepareResources on %s: %w", driver, err)
		}
		for _, c := range claims {
			msg, ok := resp[c.Uid]
			if !ok {
				msg = "claim missing from the response"
			}
			if msg != "" {
				k.rec.record(event{Event: "unprepare-failed", Pod: pc.key, PodUID: string(podUID), Driver: driver, Error: msg})
				return fmt.Errorf("%s: unprepare ResourceClaim %s/%s: %s", driver, c.Namespace, c.Name, msg)
			}
			unprepared = append(unprepared, preparedClaim{Namespace: c.Namespace, Name: c.Name, UID: c.Uid, Driver: driver})
		}
	}
	k.mu.Lock()
	delete(k.prepared, podUID)
	for _, c := range pc.claims {
		delete(k.claimPods[c.UID], podUID)
		if len(k.claimPods[c.UID]) == 0 {
			delete(k.claimPods, c.UID)
		}
	}
	k.mu.Unlock()
	k.rec.record(event{Event: "unprepared", Pod: pc.key, PodUID: string(podUID), Claims: unprepared})
	return nil
}

// markRunning records the prepared devices on the pod and reports it Running and Ready, which is
// what a user would see once kubelet started the containers.
func (k *kubelet) markRunning(ctx context.Context, pod *corev1.Pod, claims []preparedClaim) error {
	if claims == nil {
		claims = []preparedClaim{}
	}
	data, _ := json.Marshal(claims)
	if pod.Annotations[PreparedAnnotation] != string(data) {
		patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{PreparedAnnotation: string(data)}}})
		updated, err := k.client.CoreV1().Pods(pod.Namespace).Patch(ctx, pod.Name, types.MergePatchType, patch, metav1.PatchOptions{})
		if err != nil {
			return err
		}
		pod = updated
	}
	if pod.Status.Phase == corev1.PodRunning {
		return nil
	}
	now := metav1.Now()
	st := pod.DeepCopy()
	st.Status.Phase = corev1.PodRunning
	st.Status.StartTime = &now
	st.Status.HostIP = "127.0.0.1"
	st.Status.Conditions = []corev1.PodCondition{
		{Type: corev1.PodScheduled, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodInitialized, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.ContainersReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
		{Type: corev1.PodReady, Status: corev1.ConditionTrue, LastTransitionTime: now},
	}
	st.Status.ContainerStatuses = nil
	for _, c := range pod.Spec.Containers {
		st.Status.ContainerStatuses = append(st.Status.ContainerStatuses, corev1.ContainerStatus{
			Name: c.Name, Image: c.Image, ImageID: c.Image, Ready: true, Started: ptrTo(true),
			ContainerID: "fake://" + string(pod.UID) + "/" + c.Name,
			State:       corev1.ContainerState{Running: &corev1.ContainerStateRunning{StartedAt: now}},
		})
	}
	_, err := k.client.CoreV1().Pods(pod.Namespace).UpdateStatus(ctx, st, metav1.UpdateOptions{})
	return err
}
