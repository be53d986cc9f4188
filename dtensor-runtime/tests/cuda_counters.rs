//! The device work counters (`cuda::DeviceCounters`, feature `cuda`): a same-shape add is one
//! kernel launch and no copy, a matmul one cuBLAS call, a host copy one device-to-host copy of
//! the tensor's bytes, an upload one host-to-device copy. Its own test binary (its own
//! process), so that no other test's device work is counted. Without a device: the typed error,
//! a skip row, and counts that stay zero.

mod cuda_device;

use cuda_device::{device, down, up};
use dtensor_runtime::cuda::DeviceCounters;
use dtensor_runtime::ndarray::ArrayD;
use dtensor_runtime::op::BinaryOp;

#[test]
fn device_counters_count_launches_and_copies() {
    let Some(dev) = device("device_counters") else {
        assert_eq!(DeviceCounters::now(), DeviceCounters::default(), "no device work, no counts");
        return;
    };
    let a = ArrayD::from_shape_fn(vec![64, 32], |i| (i[0] + i[1]) as f32);
    let b = ArrayD::from_shape_fn(vec![32, 16], |i| (i[0] * 2 + i[1]) as f32);
    let before = DeviceCounters::now();
    let (da, db) = (up(&dev, &a), up(&dev, &b));
    let uploads = DeviceCounters::now().since(&before);
    assert_eq!((uploads.host_to_device, uploads.host_to_device_bytes), (2, (64 * 32 + 32 * 16) * 4), "{uploads:?}");

    let before = DeviceCounters::now();
    let sum = da.binary(BinaryOp::Add, &da).unwrap();
    let add = DeviceCounters::now().since(&before);
    assert_eq!(
        add,
        DeviceCounters { kernel_launches: 1, ..DeviceCounters::default() },
        "a same-shape add: one launch, no copy"
    );

    let before = DeviceCounters::now();
    let prod = da.matmul(&db).unwrap();
    let mm = DeviceCounters::now().since(&before);
    assert_eq!((mm.blas_calls, mm.host_to_device, mm.device_to_host), (1, 0, 0), "{mm:?}");

    let before = DeviceCounters::now();
    let back = down(prod);
    let d2h = DeviceCounters::now().since(&before);
    assert_eq!((d2h.device_to_host, d2h.device_to_host_bytes), (1, 64 * 16 * 4), "{d2h:?}");
    assert_eq!(back.shape(), &[64, 16]);
    drop(sum);
    println!("GPUCHECK device_counters | PASS | upload {uploads:?}; add {add:?}; matmul {mm:?}; download {d2h:?}");
}
