package main

// A real kubelet renews its node's Lease in kube-node-lease every few seconds; the controller-manager's
// node lifecycle controller marks a node whose Lease goes stale NotReady and taints it. The stand-in
// renews the Lease the same way, so its fake node stays schedulable with the usual controller set.

import (
	"context"
	"fmt"
	"os"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
)

const (
	leaseNamespace     = corev1.NamespaceNodeLease
	leaseDurationSecs  = 40 // kubelet's default nodeLeaseDurationSeconds
	leaseRenewInterval = 10 * time.Second
)

func (k *kubelet) heartbeat(ctx context.Context) {
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := k.renewLease(ctx); err != nil {
			fmt.Fprintf(os.Stderr, "kubelet: renewing the node lease: %v\n", err)
		}
	}, leaseRenewInterval)
}

func (k *kubelet) renewLease(ctx context.Context) error {
	leases := k.client.CoordinationV1().Leases(leaseNamespace)
	now := metav1.NewMicroTime(time.Now())
	lease, err := leases.Get(ctx, k.node, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		node, nerr := k.client.CoreV1().Nodes().Get(ctx, k.node, metav1.GetOptions{})
		if nerr != nil {
			return nerr
		}
		_, err = leases.Create(ctx, &coordinationv1.Lease{
			ObjectMeta: metav1.ObjectMeta{Name: k.node, Namespace: leaseNamespace, OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "v1", Kind: "Node", Name: node.Name, UID: node.UID,
			}}},
			Spec: coordinationv1.LeaseSpec{
				HolderIdentity: ptr.To(k.node), LeaseDurationSeconds: ptr.To[int32](leaseDurationSecs), RenewTime: &now,
			},
		}, metav1.CreateOptions{})
		return err
	}
	if err != nil {
		return err
	}
	lease.Spec.RenewTime = &now
	_, err = leases.Update(ctx, lease, metav1.UpdateOptions{})
	return err
}
