"""Unit tests of DLPack in Nereid's pb_utils (Tensor.from_dlpack / to_dlpack) and nereid_dlpack.

There is no GPU here: a CUDA tensor is stood in for by a DLPack capsule that says kDLCUDA over
host memory (made with nereid_dlpack.export, the function GPU tensors are exported with). That
checks the bookkeeping (device kept, same memory handed back, deleters run, Triton's errors); the
copy off a real device (nereid_dlpack.copy_to_host) only runs on a machine with a GPU
(scripts/gpu_check.sh runs tests/python/test_dlpack.py there with torch on CUDA).
"""

import ctypes
import gc

import numpy as np
import pytest

from fake_parent import pb_utils
import nereid_dlpack


def cuda_driver_present():
    try:
        ctypes.CDLL("libcuda.so.1")
        return True
    except OSError:
        return False


def fake_cuda_capsule(array, device_id=1, datatype="FP32"):
    """A DLPack capsule that says `array`'s memory is on CUDA device `device_id`."""
    return nereid_dlpack.export(array, array.ctypes.data, (nereid_dlpack.KDL_CUDA, device_id),
                                list(array.shape), datatype)


class Producer:
    """A DLPack producer (like a torch CUDA tensor) that records the stream it is asked for."""

    def __init__(self, capsule, device):
        self.capsule = capsule
        self.device = device
        self.streams = []

    def __dlpack__(self, stream=None):
        self.streams.append(stream)
        return self.capsule

    def __dlpack_device__(self):
        return self.device


def test_a_cuda_capsule_becomes_a_gpu_tensor_that_hands_back_the_same_memory():
    base = len(nereid_dlpack._EXPORTED)
    memory = np.arange(6, dtype=np.float32).reshape(2, 3)
    tensor = pb_utils.Tensor.from_dlpack("G", fake_cuda_capsule(memory, device_id=1))
    assert not tensor.is_cpu()
    assert tensor.shape() == [2, 3] and tensor.triton_dtype() == 11 and tensor.name() == "G"
    assert tensor.__dlpack_device__() == (2, 1)
    assert "device=GPU 1" in repr(tensor)
    with pytest.raises(pb_utils.TritonModelException) as e:
        tensor.as_numpy()
    assert str(e.value) == "Tensor is stored in GPU and cannot be converted to NumPy."
    # to_dlpack: a new capsule over the same device memory, still on device 1.
    capsule = tensor.to_dlpack()
    assert nereid_dlpack.capsule_device(capsule) == (2, 1)
    again = nereid_dlpack.DeviceMemory(capsule)
    assert again.ptr == memory.ctypes.data and again.shape == [2, 3] and again.datatype == "FP32"
    assert again.nbytes == memory.nbytes
    # A second GPU tensor from the exported capsule shares it too; consumed capsules are refused.
    with pytest.raises(nereid_dlpack.DLPackError, match="already consumed"):
        nereid_dlpack.DeviceMemory(capsule)
    # Every exported capsule's deleter ran once nothing holds it any more.
    del tensor, again, capsule, e
    gc.collect()
    assert len(nereid_dlpack._EXPORTED) == base


def test_a_producer_on_cuda_is_asked_for_the_legacy_default_stream():
    memory = np.ones(4, dtype=np.float16)
    producer = Producer(fake_cuda_capsule(memory, device_id=0, datatype="FP16"), (2, 0))
    tensor = pb_utils.Tensor.from_dlpack("H", producer)
    assert producer.streams == [1]
    assert not tensor.is_cpu() and tensor.triton_dtype() == 10 and tensor.shape() == [4]


def test_an_unconsumed_exported_capsule_releases_its_owner():
    base = len(nereid_dlpack._EXPORTED)
    capsule = fake_cuda_capsule(np.zeros(3, np.int64))
    assert len(nereid_dlpack._EXPORTED) == base + 1
    del capsule
    gc.collect()
    assert len(nereid_dlpack._EXPORTED) == base


@pytest.mark.skipif(cuda_driver_present(), reason="checks the refusal on a machine without CUDA")
def test_a_gpu_tensor_cannot_leave_the_stub_without_the_cuda_driver():
    tensor = pb_utils.Tensor.from_dlpack("OUT", fake_cuda_capsule(np.zeros(2, np.float32)))
    with pytest.raises(pb_utils.TritonModelException) as e:
        tensor._host_array()
    assert str(e.value).startswith(
        "cannot copy GPU tensor 'OUT' to the host: the CUDA driver (libcuda.so.1) cannot be loaded"
    )


def test_cpu_producers_and_capsules_share_memory_both_ways():
    array = np.arange(4, dtype=np.int32)
    imported = pb_utils.Tensor.from_dlpack("I", array)
    assert imported.is_cpu() and imported.__dlpack_device__() == (1, 0)
    assert imported.as_numpy().ctypes.data == array.ctypes.data
    tensor = pb_utils.Tensor("C", array)
    # A consumer (NumPy here, torch in test_dlpack.py) sees the tensor's own memory.
    view = np.from_dlpack(tensor)
    assert view.ctypes.data == array.ctypes.data
    from_capsule = pb_utils.Tensor.from_dlpack("D", tensor.to_dlpack())
    assert from_capsule.as_numpy().ctypes.data == array.ctypes.data
    # The host copy of a CPU tensor is the array itself: no copy at the output boundary.
    assert tensor._host_array() is tensor.as_numpy()


def test_triton_refusals():
    strided = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    with pytest.raises(pb_utils.TritonModelException) as e:
        pb_utils.Tensor.from_dlpack("S", strided)
    assert str(e.value) == (
        "DLPack tensor is not contiguous. Only contiguous DLPack tensors that are stored in "
        "C-Order are supported."
    )
    other_device = Producer(None, (8, 0))
    with pytest.raises(pb_utils.TritonModelException) as e:
        pb_utils.Tensor.from_dlpack("V", other_device)
    assert str(e.value) == "DLDevice type 8 is not support by Python backend."

    class NoDevice:
        def __dlpack__(self, stream=None):
            raise AssertionError("not asked")

    with pytest.raises(pb_utils.TritonModelException, match="Provided tensor is not supported"):
        pb_utils.Tensor.from_dlpack("N", NoDevice())
    with pytest.raises(pb_utils.TritonModelException, match="Tensor name cannot be an empty string"):
        pb_utils.Tensor.from_dlpack("", np.zeros(1))
    capsule = np.zeros(2, np.float32).__dlpack__()
    pb_utils.Tensor.from_dlpack("once", capsule)
    with pytest.raises(pb_utils.TritonModelException, match="already consumed"):
        pb_utils.Tensor.from_dlpack("twice", capsule)


def test_bf16_goes_through_dlpack_both_ways_without_a_copy():
    # BF16 bits of 1.0, 2.0, -0.5, 3.0 (the high halves of their FP32 patterns).
    bits = np.array([0x3F80, 0x4000, 0xBF00, 0x4040], dtype=np.uint16)
    tensor = pb_utils.Tensor._from_wire("B", "BF16", bits)
    with pytest.raises(pb_utils.TritonModelException, match="BF16"):
        tensor.as_numpy()
    capsule = tensor.to_dlpack()
    assert nereid_dlpack.capsule_datatype(capsule) == "BF16"
    back = pb_utils.Tensor.from_dlpack("C", capsule)
    assert back.triton_dtype() == 14 and back.shape() == [4] and back.is_cpu()
    assert back._array.ctypes.data == bits.ctypes.data, "the same memory, not a copy"
    np.testing.assert_array_equal(back._array, bits)
    # A producer (as a torch bfloat16 tensor is) works as a capsule does, and its memory lives
    # as long as the tensor made from it.
    producer_bits = np.array([[0x3F80, 0x0000]], dtype=np.uint16)
    producer = Producer(nereid_dlpack.export(producer_bits, producer_bits.ctypes.data,
                                             (nereid_dlpack.KDL_CPU, 0), [1, 2], "BF16"),
                        (nereid_dlpack.KDL_CPU, 0))
    made = pb_utils.Tensor.from_dlpack("P", producer)
    del producer, producer_bits
    gc.collect()
    assert made.shape() == [1, 2] and made._array.tolist() == [[0x3F80, 0]]
    # Empty BF16 tensors too.
    empty = pb_utils.Tensor._from_wire("E", "BF16", np.empty((0, 3), np.uint16))
    assert pb_utils.Tensor.from_dlpack("E2", empty.to_dlpack()).shape() == [0, 3]
