//! Python backend (`backend: "python"`): Triton `model.py` files, each instance in its own
//! stub process, so user code that raises, exits or crashes never takes the server down.
//!
//! ```text
//!  PythonBackend (one per server: runtime dir with the shipped .py files, default interpreter)
//!   auto_complete ─► throw-away stub: auto_complete ─► auto_complete_done ─► config
//!   load_instance ─► settings (interpreter, timeouts) ─► stub: init ─► init_done
//!                 ─► PythonInstance { supervised stub }
//!  PythonInstance::execute_requests ─► execute ─► execute_done (decoupled: response messages)
//!  stub dies ─► Health unhealthy ─► supervisor restarts it in the background ─► healthy
//!  SHARED_STUB_PROCESS: load_instance ─► placement ─► the version's shared host for it (the
//!      first member launches it; kept here, weakly, while its instances hold it)
//!      ─► PythonInstance::load_member ─► a member, restarted with its whole process
//! ```
//!
//! The wire protocol is docs/internals/python-stub-protocol.md: length-prefixed JSON frames
//! on a Unix socket (`nereid_stub_protocol`: the messages and frames, shared with the stub's compiled
//! core) and tensor data in shared-memory files ([`shm`]).
//! Model parameters that tune the backend are listed in [`settings`].

mod bls;
mod children;
mod convert;
mod custom_metrics;
mod env_archive;
mod execute;
pub(crate) mod fuzzing;
mod instance;
mod link;
mod model_control;
mod process;
mod reader;
mod runtime;
mod settings;
mod shared;
mod shm;
mod stub;
mod stub_core;
mod supervisor;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};

use nereid_proto::pb::inference::ModelConfig;
use nereid_proto::{message_from_json, message_to_json};
use parking_lot::Mutex;

use self::children::Children;
pub use self::instance::PythonInstance;
use self::runtime::RuntimeDir;
use self::settings::StubSettings;
use self::shared::{HostKey, HostSpec, SharedHost};
use self::stub::{Stub, StubSpec};
use super::params::Params;
use super::{Backend, BackendError, BackendInstance, InstanceContext, Platforms, ServerHandle};
use crate::config::parameters;

/// The Python backend.
pub struct PythonBackend {
    /// Used when a model names no `EXECUTION_ENV_PATH`; `None` means `python3` on `PATH`.
    default_python: Option<PathBuf>,
    /// Created by the first model that needs it, shared by every stub, removed with the
    /// backend and its last instance.
    runtime: Mutex<Option<Arc<RuntimeDir>>>,
    /// Every stub process, until it is reaped.
    children: Arc<Children>,
    /// The shared stub processes of loaded versions, by version load and placement (the
    /// version's health board tells loads apart: one per load, held by the host).
    hosts: Mutex<HashMap<(usize, HostKey), Weak<SharedHost>>>,
}

impl PythonBackend {
    /// `default_python`: the interpreter of models that name no `EXECUTION_ENV_PATH` (a path,
    /// a virtual environment directory, or a program name on `PATH`), given by the binary's
    /// `--python` / `NEREID_PYTHON`; `None`: `python3` on `PATH`.
    pub fn new(default_python: Option<PathBuf>) -> Self {
        PythonBackend {
            default_python,
            runtime: Mutex::new(None),
            children: Arc::default(),
            hosts: Mutex::default(),
        }
    }

    fn runtime(&self) -> Result<Arc<RuntimeDir>, String> {
        let mut runtime = self.runtime.lock();
        if let Some(dir) = &*runtime {
            return Ok(dir.clone());
        }
        let dir = Arc::new(RuntimeDir::create()?);
        *runtime = Some(dir.clone());
        Ok(dir)
    }

    /// Removes the runtime directory now, even while stubs still hold it: at server exit the
    /// stubs have imported their modules long ago and are about to see EOF.
    pub fn cleanup(&self) {
        if let Some(dir) = self.runtime.lock().take() {
            let _ = std::fs::remove_dir_all(dir.path());
        }
    }

    /// Shutdown, once every model is unloaded (its stubs asked to finalize): waits for every
    /// stub to exit, at most until `deadline`, then kills and reaps those left and removes
    /// their shared-memory directories. Returns the stubs it had to kill; no stub starts
    /// afterwards.
    pub fn stop_stubs(&self, deadline: std::time::Instant) -> Vec<String> {
        self.children.stop_all(deadline)
    }

    fn settings(
        &self,
        model: &str,
        parameters: &Params,
        model_dir: &Path,
    ) -> Result<StubSettings, String> {
        StubSettings::new(model, parameters, model_dir, self.default_python.as_deref())
    }
}

impl Default for PythonBackend {
    fn default() -> Self {
        Self::new(None)
    }
}

impl Backend for PythonBackend {
    fn name(&self) -> &'static str {
        "python"
    }

    fn default_model_filename(&self) -> &'static str {
        "model.py"
    }

    fn check_parameters(&self, config: &ModelConfig) -> Result<(), String> {
        settings::check_parameters(&config.name, &parameters(config))
    }

    /// No platform name; a `model.py` is a Python model.
    fn platforms(&self) -> Platforms {
        Platforms {
            names: &[],
            implied: None,
            files: &[("model.py", None)],
        }
    }

    /// One stub process per instance.
    fn out_of_process(&self) -> bool {
        true
    }

    /// A Python model decides itself whether it uses the GPU it is given (Triton passes
    /// `model_instance_kind: "GPU"` and the device id to `initialize`), so GPU instances are
    /// always allowed.
    fn gpu_support(&self) -> Result<(), String> {
        Ok(())
    }

    /// Runs the model's `auto_complete_config` (if it has one) in a throw-away stub.
    fn auto_complete(
        &self,
        config: &mut ModelConfig,
        model_path: &Path,
    ) -> Result<(), BackendError> {
        let fail = |e: String| BackendError::auto_complete(&config.name, e);
        let model_file = model_file(model_path).map_err(fail)?;
        let version_dir = model_file.parent().unwrap_or(Path::new("/")).to_path_buf();
        let model_dir = version_dir.parent().unwrap_or(Path::new("/"));
        let settings = self
            .settings(&config.name, &parameters(config), model_dir)
            .map_err(fail)?;
        let spec = StubSpec {
            model: config.name.clone(),
            instance: "auto_complete".into(),
            throwaway: true,
            python: settings.python,
            runtime: self.runtime().map_err(fail)?,
            cwd: version_dir.clone(),
            start_timeout: settings.start_timeout,
            initialize_timeout: settings.initialize_timeout,
            server: Arc::new(ServerHandle::default()),
            children: self.children.clone(),
        };
        let stub = Stub::launch(&spec, None).map_err(|e| fail(e.to_string()))?;
        let completed = stub
            .auto_complete(
                model_file.to_string_lossy().into_owned(),
                message_to_json(config),
            )
            .map_err(|e| fail(e.to_string()))?;
        stub.wait_exit();
        drop(stub);
        *config = message_from_json(&completed.to_string()).map_err(|e| {
            fail(format!(
                "auto_complete_config produced an invalid config: {e}"
            ))
        })?;
        Ok(())
    }

    fn load_instance(
        &self,
        ctx: &InstanceContext,
    ) -> Result<Box<dyn BackendInstance>, BackendError> {
        let fail = |e: String| {
            BackendError::Load(format!(
                "model '{}' instance '{}': {e}",
                ctx.model_name, ctx.instance_name
            ))
        };
        model_file(&ctx.model_path).map_err(fail)?;
        let settings = self
            .settings(&ctx.config.name, &ctx.config.parameters, &ctx.model_dir)
            .map_err(BackendError::Load)?;
        let runtime = self.runtime().map_err(fail)?;
        let placement = settings.shared.and_then(|per_process| {
            shared::placement(&ctx.config.instance_groups, &ctx.instance_name, per_process)
        });
        let instance = match placement {
            None => PythonInstance::load(ctx, settings, runtime, self.children.clone())?,
            Some(placement) => {
                let host = self.shared_host(ctx, settings, runtime, &placement)?;
                PythonInstance::load_member(ctx, host, placement.member)?
            }
        };
        tracing::info!(model = %ctx.model_name, version = ctx.version, instance = %ctx.instance_name, "loaded Python model instance");
        Ok(Box::new(instance))
    }
}

impl PythonBackend {
    /// The shared stub process `placement` names for `ctx`'s version load, launched by its
    /// first member. The instances of one load are loaded one after the other, so no two
    /// threads launch the same host.
    fn shared_host(
        &self,
        ctx: &InstanceContext,
        settings: StubSettings,
        runtime: Arc<RuntimeDir>,
        placement: &shared::Placement,
    ) -> Result<Arc<SharedHost>, BackendError> {
        let key = (Arc::as_ptr(&ctx.health) as usize, placement.key.clone());
        if let Some(host) = self.hosts.lock().get(&key).and_then(Weak::upgrade) {
            return Ok(host);
        }
        let first = placement.names.first().unwrap_or(&ctx.instance_name);
        let host = Arc::new(SharedHost::launch(HostSpec {
            spec: instance::stub_spec(ctx, settings, runtime, self.children.clone(), first),
            names: placement.names.clone(),
            model_file: instance::model_file(ctx)?,
            decoupled: ctx.config.decoupled,
            health: ctx.health.clone(),
        })?);
        let mut hosts = self.hosts.lock();
        hosts.retain(|_, host| host.strong_count() > 0);
        hosts.insert(key, Arc::downgrade(&host));
        Ok(host)
    }
}

/// The model file as an absolute path; it must exist.
fn model_file(model_path: &Path) -> Result<PathBuf, String> {
    if !model_path.is_file() {
        return Err(format!(
            "model file '{}' does not exist",
            model_path.display()
        ));
    }
    std::path::absolute(model_path)
        .map_err(|e| format!("model file '{}': {e}", model_path.display()))
}
