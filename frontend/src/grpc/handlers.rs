//! The rpc handlers: one method per rpc, each a translation over [`InferenceService`].
//!
//! Handlers hold no logic of their own: they parse the wire request (versions through
//! [`nereid_proto::parse_version`], infer requests through [`super::infer`], repository parameters
//! through [`super::repository`]), await the service, and map the result; errors become a
//! `tonic::Status` through [`super::error`]. Every unary handler runs inside the rpc's own
//! future, so a client that cancels drops the `InferenceService` future with it; nothing is
//! spawned. `ModelStreamInfer` hands its stream to [`super::stream`], whose task lives exactly
//! as long as the client's response stream.

use std::sync::Arc;

use tonic::{Request, Response, Status};

use crate::grpc::stream::{self, ErrorMode};
use crate::grpc::{GrpcConfig, infer, repository, settings, shm};
use crate::shm::{resolve_inputs, write_outputs};
use nereid_proto::pb::health::health_check_response::ServingStatus;
use nereid_proto::pb::health::health_server::Health;
use nereid_proto::pb::health::{HealthCheckRequest, HealthCheckResponse};
use nereid_proto::pb::inference::grpc_inference_service_server::GrpcInferenceService;
use nereid_proto::pb::inference::model_metadata_response::TensorMetadata;
use nereid_proto::pb::inference::repository_index_response::ModelIndex;
use nereid_proto::pb::inference::*;
use nereid_proto::{InferenceService, UnloadRequest, codec};

/// Serves both generated services over one shared [`InferenceService`].
pub(crate) struct GrpcFrontend {
    service: Arc<dyn InferenceService>,
    config: GrpcConfig,
}

impl GrpcFrontend {
    pub(crate) fn new(service: Arc<dyn InferenceService>, config: GrpcConfig) -> Self {
        GrpcFrontend { service, config }
    }
}

type RpcResult<T> = Result<Response<T>, Status>;

fn tensor_metadata(t: nereid_proto::TensorMetadata) -> TensorMetadata {
    TensorMetadata {
        name: t.name,
        datatype: t.datatype,
        shape: t.shape,
    }
}

#[tonic::async_trait]
impl GrpcInferenceService for GrpcFrontend {
    async fn server_live(&self, _: Request<ServerLiveRequest>) -> RpcResult<ServerLiveResponse> {
        Ok(Response::new(ServerLiveResponse {
            live: self.service.server_live().await,
        }))
    }

    async fn server_ready(&self, _: Request<ServerReadyRequest>) -> RpcResult<ServerReadyResponse> {
        Ok(Response::new(ServerReadyResponse {
            ready: self.service.server_ready().await,
        }))
    }

    async fn model_ready(
        &self,
        request: Request<ModelReadyRequest>,
    ) -> RpcResult<ModelReadyResponse> {
        let r = request.into_inner();
        let version = nereid_proto::parse_version(&r.version)?;
        let ready = self.service.model_ready(&r.name, version).await?;
        Ok(Response::new(ModelReadyResponse { ready }))
    }

    async fn server_metadata(
        &self,
        _: Request<ServerMetadataRequest>,
    ) -> RpcResult<ServerMetadataResponse> {
        let m = self.service.server_metadata();
        Ok(Response::new(ServerMetadataResponse {
            name: m.name,
            version: m.version,
            extensions: m.extensions,
        }))
    }

    async fn model_metadata(
        &self,
        request: Request<ModelMetadataRequest>,
    ) -> RpcResult<ModelMetadataResponse> {
        let r = request.into_inner();
        let version = nereid_proto::parse_version(&r.version)?;
        let m = self.service.model_metadata(&r.name, version).await?;
        Ok(Response::new(ModelMetadataResponse {
            name: m.name,
            versions: m.versions,
            platform: m.platform,
            inputs: m.inputs.into_iter().map(tensor_metadata).collect(),
            outputs: m.outputs.into_iter().map(tensor_metadata).collect(),
        }))
    }

    async fn model_infer(
        &self,
        request: Request<ModelInferRequest>,
    ) -> RpcResult<ModelInferResponse> {
        let (mut request, shm_plan) =
            infer::decode_call(request, &self.config.limits, &self.config.header_forward)?;
        let shm = &self.config.shared_memory;
        resolve_inputs(shm, &mut request, shm_plan.inputs).await?;
        let hook = nereid_proto::ResponseHook::new();
        request.context.response_hook = hook.clone();
        let response = self.service.infer(request).await?;
        let written = write_outputs(shm, shm_plan.outputs, &response).await?;
        let mut encoded = codec::encode_response(response);
        infer::drop_written_contents(&mut encoded, &written);
        hook.finish(std::time::Instant::now());
        Ok(Response::new(encoded))
    }

    type ModelStreamInferStream = stream::Responses;

    async fn model_stream_infer(
        &self,
        request: Request<tonic::Streaming<ModelInferRequest>>,
    ) -> RpcResult<Self::ModelStreamInferStream> {
        let mode = ErrorMode::from_metadata(request.metadata());
        let mut load = tonic::metadata::MetadataMap::new();
        crate::orca::annotate_grpc(self.service.as_ref(), request.metadata(), &mut load).await;
        let context = infer::request_context(request.metadata(), std::time::Instant::now());
        let mut forwarded = nereid_proto::Parameters::new();
        let forwarded = (self.config.header_forward)
            .apply_grpc(request.metadata(), &mut forwarded)
            .map(|()| forwarded);
        let mut response = Response::new(stream::serve_stream(
            self.service.clone(),
            request.into_inner(),
            mode,
            context,
            forwarded,
            self.config.stream_response_buffer,
            self.config.limits,
        ));
        *response.metadata_mut() = load;
        Ok(response)
    }

    async fn model_config(
        &self,
        request: Request<ModelConfigRequest>,
    ) -> RpcResult<ModelConfigResponse> {
        let r = request.into_inner();
        let version = nereid_proto::parse_version(&r.version)?;
        let config = self.service.model_config(&r.name, version).await?;
        Ok(Response::new(ModelConfigResponse {
            config: Some(config),
        }))
    }

    async fn model_statistics(
        &self,
        request: Request<ModelStatisticsRequest>,
    ) -> RpcResult<ModelStatisticsResponse> {
        let r = request.into_inner();
        let version = nereid_proto::parse_version(&r.version)?;
        let model_stats = self.service.model_statistics(&r.name, version).await?;
        Ok(Response::new(ModelStatisticsResponse { model_stats }))
    }

    async fn repository_index(
        &self,
        request: Request<RepositoryIndexRequest>,
    ) -> RpcResult<RepositoryIndexResponse> {
        let r = request.into_inner();
        repository::check_repository_name(&r.repository_name)?;
        let entries = self.service.repository_index(r.ready).await?;
        let models = entries
            .into_iter()
            .map(|e| ModelIndex {
                name: e.name,
                version: e.version,
                state: e.state,
                reason: e.reason,
            })
            .collect();
        Ok(Response::new(RepositoryIndexResponse { models }))
    }

    async fn repository_model_load(
        &self,
        request: Request<RepositoryModelLoadRequest>,
    ) -> RpcResult<RepositoryModelLoadResponse> {
        let credential = repository::credential(request.metadata());
        let r = request.into_inner();
        repository::check_repository_name(&r.repository_name)?;
        let mut load = repository::load_request(r.parameters)?;
        load.credential = credential;
        self.service.load_model(&r.model_name, load).await?;
        Ok(Response::new(RepositoryModelLoadResponse {}))
    }

    async fn repository_model_unload(
        &self,
        request: Request<RepositoryModelUnloadRequest>,
    ) -> RpcResult<RepositoryModelUnloadResponse> {
        let credential = repository::credential(request.metadata());
        let r = request.into_inner();
        repository::check_repository_name(&r.repository_name)?;
        let unload = UnloadRequest {
            unload_dependents: repository::unload_dependents(&r.parameters)?,
            credential,
        };
        self.service.unload_model(&r.model_name, unload).await?;
        Ok(Response::new(RepositoryModelUnloadResponse {}))
    }

    async fn system_shared_memory_status(
        &self,
        request: Request<SystemSharedMemoryStatusRequest>,
    ) -> RpcResult<SystemSharedMemoryStatusResponse> {
        let name = request.into_inner().name;
        let name = (!name.is_empty()).then_some(name.as_str());
        let regions = self.config.shared_memory.status(name)?;
        Ok(Response::new(shm::status_response(regions)))
    }

    async fn system_shared_memory_register(
        &self,
        request: Request<SystemSharedMemoryRegisterRequest>,
    ) -> RpcResult<SystemSharedMemoryRegisterResponse> {
        let r = request.into_inner();
        shm::check_name(&r.name)?;
        self.config
            .shared_memory
            .register(&r.name, &r.key, r.offset, r.byte_size)?;
        Ok(Response::new(SystemSharedMemoryRegisterResponse {}))
    }

    async fn system_shared_memory_unregister(
        &self,
        request: Request<SystemSharedMemoryUnregisterRequest>,
    ) -> RpcResult<SystemSharedMemoryUnregisterResponse> {
        let name = request.into_inner().name;
        let name = (!name.is_empty()).then_some(name.as_str());
        self.config.shared_memory.unregister(name)?;
        Ok(Response::new(SystemSharedMemoryUnregisterResponse {}))
    }

    async fn cuda_shared_memory_status(
        &self,
        request: Request<CudaSharedMemoryStatusRequest>,
    ) -> RpcResult<CudaSharedMemoryStatusResponse> {
        let name = request.into_inner().name;
        let name = (!name.is_empty()).then_some(name.as_str());
        let regions = self.config.shared_memory.cuda_status(name)?;
        Ok(Response::new(shm::cuda_status_response(regions)))
    }

    async fn cuda_shared_memory_register(
        &self,
        request: Request<CudaSharedMemoryRegisterRequest>,
    ) -> RpcResult<CudaSharedMemoryRegisterResponse> {
        let r = request.into_inner();
        self.config.shared_memory.register_cuda(
            &r.name,
            &r.raw_handle,
            r.device_id,
            r.byte_size,
        )?;
        Ok(Response::new(CudaSharedMemoryRegisterResponse {}))
    }

    async fn cuda_shared_memory_unregister(
        &self,
        request: Request<CudaSharedMemoryUnregisterRequest>,
    ) -> RpcResult<CudaSharedMemoryUnregisterResponse> {
        let name = request.into_inner().name;
        let name = (!name.is_empty()).then_some(name.as_str());
        self.config.shared_memory.unregister_cuda(name)?;
        Ok(Response::new(CudaSharedMemoryUnregisterResponse {}))
    }

    async fn trace_setting(
        &self,
        request: Request<TraceSettingRequest>,
    ) -> RpcResult<TraceSettingResponse> {
        let (model, update) = settings::trace_request(request.into_inner());
        let settings = self
            .service
            .trace_settings(model.as_deref(), update)
            .await?;
        Ok(Response::new(settings::trace_response(settings)))
    }

    async fn log_settings(
        &self,
        request: Request<LogSettingsRequest>,
    ) -> RpcResult<LogSettingsResponse> {
        let update = settings::log_request(request.into_inner())?;
        let settings = self.service.log_settings(update).await?;
        Ok(Response::new(settings::log_response(settings)))
    }
}

#[tonic::async_trait]
impl Health for GrpcFrontend {
    /// SERVING while the server is live, like Triton; the requested service name is not
    /// consulted.
    async fn check(&self, _: Request<HealthCheckRequest>) -> RpcResult<HealthCheckResponse> {
        let status = if self.service.server_live().await {
            ServingStatus::Serving
        } else {
            ServingStatus::NotServing
        };
        Ok(Response::new(HealthCheckResponse {
            status: status.into(),
        }))
    }
}
