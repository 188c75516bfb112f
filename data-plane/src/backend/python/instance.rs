//! [`PythonInstance`]: one model instance as the scheduler sees it — request-level, one stub:
//! a process of its own (supervised alone) or a member of a shared stub process (see the
//! shared module).

use std::sync::Arc;

use nereid_proto::{Tensor, message_to_json};

use super::children::Children;
use super::convert::ModelInfo;
use super::execute::{self, BatchResult};
use super::runtime::RuntimeDir;
use super::settings::StubSettings;
use super::shared::SharedHost;
use super::stub::{Stub, StubSpec};
use super::supervisor::{Launcher, Supervised};
use crate::backend::{
    BackendError, BackendInstance, BatchInputs, DeviceKind, InstanceContext, Phases, RequestView,
};
use nereid_stub_protocol::message::InitArgs;

/// One instance of a Python model.
pub struct PythonInstance {
    model: ModelInfo,
    stubs: Stubs,
}

/// Where the instance's stub runs.
enum Stubs {
    /// A process of its own.
    Own(Supervised),
    /// Member `member` of a shared stub process.
    Member {
        host: Arc<SharedHost>,
        member: usize,
    },
}

impl Stubs {
    fn current(&self) -> Result<Arc<Stub>, String> {
        match self {
            Stubs::Own(supervised) => supervised.current(),
            Stubs::Member { host, member } => host.current(*member),
        }
    }

    fn pid(&self) -> Option<u32> {
        match self {
            Stubs::Own(supervised) => supervised.pid(),
            Stubs::Member { host, .. } => host.pid(),
        }
    }
}

impl Drop for PythonInstance {
    /// A member's `finalize` runs here; a process of its own is finalized by its supervisor.
    fn drop(&mut self) {
        if let Stubs::Member { host, member } = &self.stubs {
            host.finalize_member(*member);
        }
    }
}

impl PythonInstance {
    /// Starts the instance's stub, runs the model's `initialize`, and starts its supervisor.
    pub fn load(
        ctx: &InstanceContext,
        settings: StubSettings,
        runtime: Arc<RuntimeDir>,
        children: Arc<Children>,
    ) -> Result<Self, BackendError> {
        let launcher = Launcher {
            spec: stub_spec(ctx, settings, runtime, children, &ctx.instance_name),
            model_file: model_file(ctx)?,
            args: init_args(ctx),
            decoupled: ctx.config.decoupled,
        };
        let stub = launcher
            .start(None)
            .map_err(|e| BackendError::Load(e.to_string()))?;
        let stubs = Supervised::start(stub, launcher, ctx.health.clone())
            .map_err(|e| load_error(ctx, &e))?;
        Ok(PythonInstance {
            model: model_info(ctx),
            stubs: Stubs::Own(stubs),
        })
    }

    /// Initializes the instance as member `member` of the shared stub process `host`.
    pub fn load_member(
        ctx: &InstanceContext,
        host: Arc<SharedHost>,
        member: usize,
    ) -> Result<Self, BackendError> {
        host.initialize(member, init_args(ctx))?;
        Ok(PythonInstance {
            model: model_info(ctx),
            stubs: Stubs::Member { host, member },
        })
    }
}

fn model_info(ctx: &InstanceContext) -> ModelInfo {
    ModelInfo {
        name: ctx.model_name.clone(),
        version: ctx.version,
        decoupled: ctx.config.decoupled,
    }
}

/// How to start a stub for `ctx`'s model; `instance` names it (a shared process: its first
/// member).
pub fn stub_spec(
    ctx: &InstanceContext,
    settings: StubSettings,
    runtime: Arc<RuntimeDir>,
    children: Arc<Children>,
    instance: &str,
) -> StubSpec {
    StubSpec {
        model: ctx.model_name.clone(),
        instance: instance.to_string(),
        throwaway: false,
        python: settings.python,
        runtime,
        cwd: version_dir(ctx),
        start_timeout: settings.start_timeout,
        initialize_timeout: settings.initialize_timeout,
        server: ctx.server.clone(),
        children,
    }
}

/// `model.py` as an absolute path.
pub fn model_file(ctx: &InstanceContext) -> Result<String, BackendError> {
    let file = std::path::absolute(&ctx.model_path)
        .map_err(|e| load_error(ctx, &format!("model file path: {e}")))?;
    Ok(file.to_string_lossy().into_owned())
}

impl BackendInstance for PythonInstance {
    fn execute(
        &mut self,
        _inputs: &BatchInputs<'_>,
        _outputs: &[String],
    ) -> Result<Vec<Tensor>, BackendError> {
        Err(BackendError::Unsupported(format!(
            "model '{}': Python models execute whole requests, not joined batches",
            self.model.name
        )))
    }

    fn request_level(&self) -> bool {
        true
    }

    fn execute_requests(
        &mut self,
        requests: &[RequestView<'_>],
        phases: &mut Phases,
    ) -> BatchResult {
        let stub = self.stubs.current().map_err(BackendError::Execution)?;
        execute::execute(&stub, requests, &self.model, phases)
    }

    fn process_id(&self) -> Option<u32> {
        self.stubs.pid()
    }
}

/// The stub runs in the version directory (`model.py`'s directory).
fn version_dir(ctx: &InstanceContext) -> std::path::PathBuf {
    ctx.model_path.parent().map_or_else(
        || ctx.model_dir.join(ctx.version.to_string()),
        |p| p.to_path_buf(),
    )
}

/// What `initialize(self, args)` receives.
fn init_args(ctx: &InstanceContext) -> InitArgs {
    let (kind, device_id) = match ctx.device {
        DeviceKind::Cpu => ("CPU", 0),
        DeviceKind::Gpu { device_id } => ("GPU", device_id),
    };
    InitArgs {
        // Triton hands `initialize` the config's JSON form: rendered from the wire config.
        model_config: message_to_json(ctx.config.wire()).to_string(),
        model_instance_kind: kind.to_string(),
        model_instance_name: ctx.instance_name.clone(),
        model_instance_device_id: device_id.to_string(),
        model_repository: ctx.model_dir.to_string_lossy().into_owned(),
        model_version: ctx.version.to_string(),
        model_name: ctx.model_name.clone(),
    }
}

fn load_error(ctx: &InstanceContext, what: &str) -> BackendError {
    BackendError::Load(format!(
        "model '{}' instance '{}': {what}",
        ctx.model_name, ctx.instance_name
    ))
}
