"""Unit tests of Nereid's triton_python_backend_utils, used outside the stub (no `_channel`)."""

import json

import numpy as np
import pytest

from fake_parent import pb_utils


def test_bytes_tensor_serialization_round_trip():
    values = np.array([[b"ab", b""], ["h\u00e9", 7]], dtype=object)
    encoded = pb_utils.serialize_byte_tensor(values)
    assert encoded.dtype == np.object_ and encoded.ndim == 0
    assert encoded.item() == b"\x02\x00\x00\x00ab\x00\x00\x00\x00\x03\x00\x00\x00h\xc3\xa9\x01\x00\x00\x007"
    decoded = pb_utils.deserialize_bytes_tensor(encoded.item())
    assert decoded.dtype == np.object_
    assert decoded.tolist() == [b"ab", b"", "h\u00e9".encode(), b"7"]
    assert pb_utils.deserialize_bytes_tensor(encoded).tolist() == decoded.tolist()
    assert pb_utils.serialize_byte_tensor(np.array([], dtype=object)).size == 0
    assert pb_utils.deserialize_bytes_tensor(b"").shape == (0,)
    assert pb_utils.serialize_byte_tensor(np.array([b"xy"], dtype=np.bytes_)).item() == b"\x02\x00\x00\x00xy"


@pytest.mark.parametrize("data", [b"\x05\x00\x00\x00abc", b"\x01\x00"], ids=["short-element", "short-prefix"])
def test_deserialize_rejects_truncated_data(data):
    with pytest.raises(pb_utils.TritonModelException, match="malformed BYTES data"):
        pb_utils.deserialize_bytes_tensor(data)


def test_serialize_rejects_numeric_arrays():
    with pytest.raises(pb_utils.TritonModelException, match="dtype object"):
        pb_utils.serialize_byte_tensor(np.zeros(2, np.float32))


def test_type_mappings():
    assert pb_utils.triton_string_to_numpy("TYPE_FP32") is np.float32
    assert pb_utils.triton_string_to_numpy("TYPE_STRING") is np.object_
    assert pb_utils.triton_string_to_numpy("TYPE_BOOL") is np.bool_
    assert pb_utils.numpy_to_triton_type(np.float32) == 11
    assert pb_utils.numpy_to_triton_type(np.object_) == 13
    assert pb_utils.numpy_to_triton_type(np.bytes_) == 13
    assert pb_utils.numpy_to_triton_type(np.uint16) == 3
    assert pb_utils.triton_to_numpy_type(9) is np.int64
    assert pb_utils.triton_to_numpy_type(13) is np.object_
    assert pb_utils.triton_to_numpy_type("FP16") is np.float16
    for code in range(1, 14):
        assert pb_utils.numpy_to_triton_type(pb_utils.triton_to_numpy_type(code)) == code
    with pytest.raises(pb_utils.TritonModelException, match="BF16 has no NumPy type"):
        pb_utils.triton_string_to_numpy("TYPE_BF16")
    with pytest.raises(pb_utils.TritonModelException, match="no Triton datatype"):
        pb_utils.numpy_to_triton_type(np.complex64)
    with pytest.raises(pb_utils.TritonModelException, match="config datatype name"):
        pb_utils.triton_string_to_numpy("FP32")


def test_tensor_accessors_and_contiguity():
    base = np.arange(12, dtype=np.int32).reshape(3, 4)
    tensor = pb_utils.Tensor("T", base[:, ::2])
    assert tensor.name() == "T" and tensor.shape() == [3, 2] and tensor.triton_dtype() == 8
    assert tensor.is_cpu() and tensor.as_numpy().flags.c_contiguous
    np.testing.assert_array_equal(tensor.as_numpy(), base[:, ::2])
    assert pb_utils.Tensor("S", np.array([b"a"], dtype=object)).triton_dtype() == 13
    with pytest.raises(pb_utils.TritonModelException, match="'C' has NumPy dtype complex128"):
        pb_utils.Tensor("C", np.zeros(2, np.complex128))
    with pytest.raises(pb_utils.TritonModelException, match="expects a numpy.ndarray, got list"):
        pb_utils.Tensor("L", [1, 2])


def test_tensor_dlpack_shares_memory():
    array = np.arange(4, dtype=np.float32)
    tensor = pb_utils.Tensor("D", array)
    assert tensor.__dlpack_device__() == (1, 0)
    from_capsule = pb_utils.Tensor.from_dlpack("E", tensor.to_dlpack())
    from_producer = pb_utils.Tensor.from_dlpack("F", tensor)
    array[0] = 42
    assert from_capsule.as_numpy()[0] == 42 and from_producer.as_numpy()[0] == 42
    assert from_capsule.name() == "E"
    with pytest.raises(pb_utils.TritonModelException, match="DLPack does not have support for string tensors"):
        pb_utils.Tensor("B", np.array([b"x"], dtype=object)).to_dlpack()
    with pytest.raises(pb_utils.TritonModelException, match="DLPack capsule"):
        pb_utils.Tensor.from_dlpack("G", 3)


def test_bf16_tensor_passes_through_but_has_no_numpy_view():
    tensor = pb_utils.Tensor._from_wire("H", "BF16", np.zeros(2, np.dtype("<u2")))
    assert tensor.triton_dtype() == 14 and tensor.shape() == [2]
    with pytest.raises(pb_utils.TritonModelException, match="BF16"):
        tensor.as_numpy()
    # DLPack carries it (test_dlpack_unit.py has the round trips).
    assert tensor.to_dlpack() is not None


def test_triton_error_codes():
    error = pb_utils.TritonError("nope", pb_utils.TritonError.NOT_FOUND)
    assert error.code() == 2 and error.message() == "nope" and str(error) == "nope"
    assert pb_utils.TritonError("x").code() == pb_utils.TritonError.INTERNAL
    assert [pb_utils.TritonError.UNKNOWN, pb_utils.TritonError.CANCELLED] == [0, 7]
    with pytest.raises(pb_utils.TritonModelException, match="TritonError code"):
        pb_utils.TritonError("x", 99)


def test_inference_response():
    tensor = pb_utils.Tensor("Y", np.zeros(1, np.float32))
    response = pb_utils.InferenceResponse([tensor], parameters={"a": 1, "b": True, "c": "s"})
    assert response.output_tensors() == [tensor] and not response.has_error() and response.error() is None
    assert json.loads(response.parameters()) == {"a": 1, "b": True, "c": "s"}
    assert pb_utils.get_output_tensor_by_name(response, "Y") is tensor
    assert pb_utils.get_output_tensor_by_name(response, "Z") is None
    failed = pb_utils.InferenceResponse(error=pb_utils.TritonError("bad"))
    assert failed.has_error() and failed.error().message() == "bad" and failed.parameters() == "{}"
    with pytest.raises(pb_utils.TritonModelException, match="parameter 'f' must be bool, int or str"):
        pb_utils.InferenceResponse(parameters={"f": 1.5})
    with pytest.raises(pb_utils.TritonModelException, match="must contain pb_utils.Tensor"):
        pb_utils.InferenceResponse([np.zeros(1)])


def test_bls_request_construction():
    x = pb_utils.Tensor("X", np.zeros(2, np.int64))
    request = pb_utils.InferenceRequest(
        model_name="m", requested_output_names=["Y"], inputs=[x], correlation_id="seq-1",
        flags=pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_START, parameters='{"k": "v"}')
    assert request.inputs() == [x] and request.requested_output_names() == ["Y"]
    assert request.correlation_id() == "seq-1" and request.request_id() == "" and request.timeout() == 0
    assert json.loads(request.parameters()) == {"k": "v"}
    request.set_flags(pb_utils.TRITONSERVER_REQUEST_FLAG_SEQUENCE_END)
    assert request.flags() == 2 and not request.is_cancelled()
    assert pb_utils.get_input_tensor_by_name(request, "X") is x
    positional = pb_utils.InferenceRequest("id", 5, [x], ["Y"], "m")  # Triton's positional order
    assert positional.request_id() == "id" and positional.correlation_id() == 5
    with pytest.raises(TypeError, match="model_name"):
        pb_utils.InferenceRequest(inputs=[x], requested_output_names=[])
    for bad in ({"correlation_id": 1.5}, {"correlation_id": -1}):
        with pytest.raises(pb_utils.TritonModelException, match="Correlation ID"):
            pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], **bad)
    with pytest.raises(pb_utils.TritonModelException, match="timeout must be an int in"):
        pb_utils.InferenceRequest(model_name="m", inputs=[], requested_output_names=[], timeout=-5)
    with pytest.raises(pb_utils.TritonModelException, match="only on requests passed to execute"):
        request.get_response_sender()


def test_calls_that_need_the_server_raise_outside_the_stub():
    request = pb_utils.InferenceRequest(model_name="m", requested_output_names=[], inputs=[])
    with pytest.raises(pb_utils.TritonModelException, match="needs the Nereid Python stub"):
        request.exec()
    for call in (lambda: pb_utils.load_model("m"), lambda: pb_utils.unload_model("m"),
                 lambda: pb_utils.is_model_ready("m")):
        with pytest.raises(pb_utils.TritonModelException, match="needs the Nereid Python stub"):
            call()
    with pytest.raises(pb_utils.TritonModelException, match="needs the Nereid Python stub"):
        pb_utils.MetricFamily("n", "d", pb_utils.MetricFamily.COUNTER)


def test_model_control_arguments_are_checked_before_anything_is_sent():
    bad = [
        (lambda: pb_utils.load_model(""), "model_name must be a non-empty str"),
        (lambda: pb_utils.load_model("m", config={"name": "m"}), "config must be a JSON str"),
        (lambda: pb_utils.load_model("m", "{}", files={"model.py": b""}), "file:<version>/<path>"),
        (lambda: pb_utils.load_model("m", "{}", files={"file:1/model.py": "text"}), "must be bytes"),
        (lambda: pb_utils.unload_model(None), "model_name must be a non-empty str"),
        (lambda: pb_utils.is_model_ready("m", 1), "model_version must be a str"),
    ]
    for call, message in bad:
        with pytest.raises(pb_utils.TritonModelException, match=message.replace("<", ".").replace(">", ".")):
            call()


def test_model_config_helpers():
    config = pb_utils.ModelConfig(json.dumps({
        "name": "m", "input": [{"name": "X", "data_type": "TYPE_INVALID", "dims": []}]}))
    config.add_input({"name": "X", "data_type": "TYPE_INT32", "dims": [-1], "optional": True})
    config.add_input({"name": "W", "data_type": "TYPE_FP32", "dims": [2]})
    config.add_output({"name": "Y", "data_type": "TYPE_STRING", "dims": [1]})
    config.set_max_batch_size(4)
    config.set_dynamic_batching()
    config.set_model_transaction_policy({"decoupled": True})
    config.add_batch_input({"kind": "BATCH_ELEMENT_COUNT", "target_name": ["N"], "data_type": "TYPE_FP32"})
    as_dict = config.as_dict()
    assert as_dict["input"] == [
        {"name": "X", "data_type": "TYPE_INT32", "dims": [-1], "optional": True},
        {"name": "W", "data_type": "TYPE_FP32", "dims": [2]}]
    assert as_dict["max_batch_size"] == 4 and as_dict["dynamic_batching"] == {}
    assert pb_utils.using_decoupled_model_transaction_policy(as_dict)
    assert pb_utils.using_decoupled_model_transaction_policy(config)
    assert not pb_utils.using_decoupled_model_transaction_policy({"name": "m"})
    assert pb_utils.get_input_config_by_name(as_dict, "W")["dims"] == [2]
    assert pb_utils.get_output_config_by_name(config, "Y")["data_type"] == "TYPE_STRING"
    assert pb_utils.get_input_config_by_name(as_dict, "nope") is None
    assert as_dict["batch_input"][0]["target_name"] == ["N"]


@pytest.mark.parametrize("config, edit, match", [
    ({"name": "m", "max_batch_size": 2}, lambda c: c.set_max_batch_size(8), "max_batch_size 2"),
    ({"name": "m", "sequence_batching": {}}, lambda c: c.set_dynamic_batching(), "sequence_batching"),
    ({"name": "m", "input": [{"name": "X", "data_type": "TYPE_FP32", "dims": [3]}]},
     lambda c: c.add_input({"name": "X", "data_type": "TYPE_FP32", "dims": [4]}), "dims"),
    ({"name": "m", "output": [{"name": "Y", "data_type": "TYPE_FP32", "dims": [3]}]},
     lambda c: c.add_output({"name": "Y", "data_type": "TYPE_INT8", "dims": [3]}), "data_type"),
    ({"name": "m"}, lambda c: c.add_input({"name": "X", "dims": [1]}), "missing 'data_type'"),
    ({"name": "m"}, lambda c: c.set_model_transaction_policy({"streaming": True}), "decoupled"),
])
def test_model_config_conflicts_raise(config, edit, match):
    with pytest.raises(ValueError, match=match):
        edit(pb_utils.ModelConfig(config))


def test_logger_without_stub_writes_to_stderr(capsys):
    pb_utils.Logger.log_warn("careful")
    pb_utils.Logger.log("plain", pb_utils.Logger.VERBOSE)
    assert capsys.readouterr().err == "[WARNING] careful\n[VERBOSE] plain\n"
    with pytest.raises(pb_utils.TritonModelException, match="log level"):
        pb_utils.Logger.log("x", "DEBUG")
