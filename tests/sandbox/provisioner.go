package sandbox

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	corelisters "k8s.io/client-go/listers/core/v1"
	storagelisters "k8s.io/client-go/listers/storage/v1"
	"k8s.io/client-go/tools/cache"
	"k8s.io/utils/ptr"
)

// StorageClassName is the sandbox's default StorageClass: a PVC without a
// class gets it (DefaultStorageClass admission), and the sandbox's
// provisioner gives it a hostPath PersistentVolume on the node, the way
// kind's local-path provisioner does.
const StorageClassName = "standard"

// Provisioner is the StorageClass' provisioner name.
const Provisioner = "sandbox.etcdbackup.io/hostpath"

// volumesRoot is where provisioned volumes live on the node (under the
// node's root directory on the host).
const volumesRoot = "/var/lib/sandbox-volumes"

// Annotations the PV controller and provisioners use.
const (
	annStorageProvisioner     = "volume.kubernetes.io/storage-provisioner"
	annBetaStorageProvisioner = "volume.beta.kubernetes.io/storage-provisioner"
	annProvisionedBy          = "pv.kubernetes.io/provisioned-by"
)

// provisioner is an external volume provisioner: for each claim the PV
// controller hands to it, a directory on the node and a hostPath PV
// pre-bound to the claim (the PV controller completes the binding); for a
// released PV with reclaim policy Delete, the directory and the PV go.
type provisioner struct {
	client   kubernetes.Interface
	nodePath func(string) string
	logf     func(string, ...any)

	factory   informers.SharedInformerFactory
	claims    corelisters.PersistentVolumeClaimLister
	volumes   corelisters.PersistentVolumeLister
	classes   storagelisters.StorageClassLister
	kick      chan struct{}
	cancel    context.CancelFunc
	wg        sync.WaitGroup
	startOnce sync.Once
}

// ensureStorageClass creates the default StorageClass.
func ensureStorageClass(ctx context.Context, client kubernetes.Interface) error {
	_, err := client.StorageV1().StorageClasses().Create(ctx, &storagev1.StorageClass{
		ObjectMeta: metav1.ObjectMeta{
			Name:        StorageClassName,
			Annotations: map[string]string{"storageclass.kubernetes.io/is-default-class": "true"},
		},
		Provisioner:       Provisioner,
		ReclaimPolicy:     ptr.To(corev1.PersistentVolumeReclaimDelete),
		VolumeBindingMode: ptr.To(storagev1.VolumeBindingImmediate),
	}, metav1.CreateOptions{})
	if err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create storage class %s: %w", StorageClassName, err)
	}
	return nil
}

func startProvisioner(ctx context.Context, client kubernetes.Interface, nodePath func(string) string, logf func(string, ...any)) (*provisioner, error) {
	p := &provisioner{client: client, nodePath: nodePath, logf: logf, kick: make(chan struct{}, 1)}
	p.factory = informers.NewSharedInformerFactory(client, 0)
	claims := p.factory.Core().V1().PersistentVolumeClaims()
	vols := p.factory.Core().V1().PersistentVolumes()
	classes := p.factory.Storage().V1().StorageClasses()
	p.claims, p.volumes, p.classes = claims.Lister(), vols.Lister(), classes.Lister()
	kick := cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { p.poke() },
		UpdateFunc: func(any, any) { p.poke() },
		DeleteFunc: func(any) { p.poke() },
	}
	for _, inf := range []cache.SharedIndexInformer{claims.Informer(), vols.Informer(), classes.Informer()} {
		if _, err := inf.AddEventHandler(kick); err != nil {
			return nil, fmt.Errorf("provisioner: %w", err)
		}
	}
	runCtx, cancel := context.WithCancel(context.Background())
	p.cancel = cancel
	p.factory.Start(runCtx.Done())
	for typ, ok := range p.factory.WaitForCacheSync(ctx.Done()) {
		if !ok {
			p.stop()
			return nil, fmt.Errorf("provisioner: %v cache did not sync: %w", typ, ctx.Err())
		}
	}
	p.wg.Add(1)
	go func() {
		defer p.wg.Done()
		p.loop(runCtx)
	}()
	return p, nil
}

func (p *provisioner) poke() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// loop reconciles everything on each change (a handful of objects), and
// again after a failure.
func (p *provisioner) loop(ctx context.Context) {
	for {
		retry := false
		if err := p.reconcile(ctx); err != nil && ctx.Err() == nil {
			p.logf("provisioner: %v", err)
			retry = true
		}
		var after <-chan time.Time
		if retry {
			after = time.After(time.Second)
		}
		select {
		case <-ctx.Done():
			return
		case <-p.kick:
		case <-after:
		}
	}
}

func (p *provisioner) reconcile(ctx context.Context) error {
	var errs []error
	claims, err := p.claims.List(labels.Everything())
	if err != nil {
		return err
	}
	for _, c := range claims {
		if err := p.provision(ctx, c); err != nil {
			errs = append(errs, fmt.Errorf("claim %s/%s: %w", c.Namespace, c.Name, err))
		}
	}
	vols, err := p.volumes.List(labels.Everything())
	if err != nil {
		return err
	}
	for _, v := range vols {
		if err := p.reclaim(ctx, v); err != nil {
			errs = append(errs, fmt.Errorf("volume %s: %w", v.Name, err))
		}
	}
	return errors.Join(errs...)
}

func (p *provisioner) provision(ctx context.Context, c *corev1.PersistentVolumeClaim) error {
	if c.Spec.VolumeName != "" || c.Status.Phase != corev1.ClaimPending || c.DeletionTimestamp != nil {
		return nil
	}
	if c.Annotations[annStorageProvisioner] != Provisioner && c.Annotations[annBetaStorageProvisioner] != Provisioner {
		return nil // not (yet) handed to us by the PV controller
	}
	name := "pvc-" + string(c.UID)
	if _, err := p.volumes.Get(name); err == nil {
		return nil
	}
	class, err := p.classes.Get(ptr.Deref(c.Spec.StorageClassName, ""))
	if err != nil {
		return fmt.Errorf("storage class: %w", err)
	}
	dir := path.Join(volumesRoot, fmt.Sprintf("%s_%s_%s", name, c.Namespace, c.Name))
	host := p.nodePath(dir)
	if err := os.MkdirAll(host, 0o777); err != nil {
		return err
	}
	// World-writable like the local-path provisioner's volumes: hostPath
	// volumes get no fsGroup ownership, so a non-root Pod must be able to
	// write anyway.
	if err := os.Chmod(host, 0o777); err != nil {
		return err
	}
	size, ok := c.Spec.Resources.Requests[corev1.ResourceStorage]
	if !ok {
		return errors.New("claim requests no storage")
	}
	pv := &corev1.PersistentVolume{
		ObjectMeta: metav1.ObjectMeta{
			Name:        name,
			Annotations: map[string]string{annProvisionedBy: Provisioner},
		},
		Spec: corev1.PersistentVolumeSpec{
			Capacity:                      corev1.ResourceList{corev1.ResourceStorage: size},
			AccessModes:                   c.Spec.AccessModes,
			PersistentVolumeReclaimPolicy: ptr.Deref(class.ReclaimPolicy, corev1.PersistentVolumeReclaimDelete),
			StorageClassName:              class.Name,
			VolumeMode:                    c.Spec.VolumeMode,
			ClaimRef: &corev1.ObjectReference{
				APIVersion: "v1", Kind: "PersistentVolumeClaim",
				Namespace: c.Namespace, Name: c.Name, UID: c.UID,
			},
			PersistentVolumeSource: corev1.PersistentVolumeSource{
				HostPath: &corev1.HostPathVolumeSource{Path: dir, Type: ptr.To(corev1.HostPathDirectoryOrCreate)},
			},
		},
	}
	if _, err := p.client.CoreV1().PersistentVolumes().Create(ctx, pv, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("create persistent volume: %w", err)
	}
	p.logf("provisioner: %s/%s → %s (%s)", c.Namespace, c.Name, name, host)
	return nil
}

func (p *provisioner) reclaim(ctx context.Context, v *corev1.PersistentVolume) error {
	if v.Annotations[annProvisionedBy] != Provisioner || v.Status.Phase != corev1.VolumeReleased ||
		v.Spec.PersistentVolumeReclaimPolicy != corev1.PersistentVolumeReclaimDelete || v.DeletionTimestamp != nil {
		return nil
	}
	if v.Spec.HostPath != nil {
		if err := os.RemoveAll(p.nodePath(v.Spec.HostPath.Path)); err != nil {
			return err
		}
	}
	err := p.client.CoreV1().PersistentVolumes().Delete(ctx, v.Name, metav1.DeleteOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("delete persistent volume: %w", err)
	}
	return nil
}

func (p *provisioner) stop() {
	p.startOnce.Do(func() {
		p.cancel()
		p.wg.Wait()
		p.factory.Shutdown()
	})
}
