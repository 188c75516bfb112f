//! `nereid ctl`: the operator's client of the control plane's `Management` gRPC service
//! (package `nereid.cluster.v1`).
//!
//! ```text
//! CtlArgs ─► request (pure: sizes, versions, labels ─► DeployModelRequest, ...)
//!         ─► client::Connection::call (nereid_cluster_client: token, one pass along
//!            --control-plane, a named leader first)
//!         ─► render (tables) | proto-JSON (--output json, the REST mirror's body)
//! ```
//!
//! Exit status: 0 on success, 1 when the control plane refuses or cannot be reached, 2 for
//! usage errors (clap's, and flag values checked after parsing).

mod args;
mod autoscale;
mod client;
mod render;
mod request;
mod table;
mod wait;

#[cfg(test)]
mod tests;

use std::io::Write;
use std::process::ExitCode;

use nereid_proto::pb::cluster::{
    AddMemberRequest, ClusterStatusRequest, ListModelsRequest, ListNodesRequest,
    ListPlacementsRequest, ModelRef, NodeRef, RemoveMemberRequest,
};

pub use args::CtlArgs;
use nereid_tls::{ClientTlsFiles, ClusterDial, PemFile};

use args::{ClusterCommand, CtlCommand, ModelsCommand, NodesCommand, OutputFormat, WaitArgs};
use client::{Connection, CtlError};

/// Runs one `ctl` command on a fresh single-threaded runtime and prints its result to stdout.
pub fn run(args: CtlArgs) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let mut stdout = std::io::stdout().lock();
    match runtime.block_on(execute(&args, &mut stdout)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}

/// The token from `--token-file` (first) or `--token` / `NEREID_AUTH_TOKEN`.
fn token(args: &CtlArgs) -> Result<Option<String>, CtlError> {
    if let Some(path) = &args.token_file {
        let text = std::fs::read_to_string(path).map_err(|e| {
            CtlError::Usage(format!("cannot read --token-file {}: {e}", path.display()))
        })?;
        return Ok(Some(text.trim().to_string()));
    }
    Ok(args.token.clone().filter(|t| !t.is_empty()))
}

/// Plaintext without `--tls-ca`; TLS trusting it (and presenting `--tls-cert`) with it.
fn dial(args: &CtlArgs) -> Result<ClusterDial, CtlError> {
    let identity = match (&args.tls_cert, &args.tls_key) {
        (None, None) => None,
        (Some(cert), Some(key)) => Some((
            PemFile::new("--tls-cert", cert),
            PemFile::new("--tls-key", key),
        )),
        (Some(_), None) => return Err(CtlError::Usage("--tls-cert needs --tls-key".into())),
        (None, Some(_)) => return Err(CtlError::Usage("--tls-key needs --tls-cert".into())),
    };
    let Some(ca) = &args.tls_ca else {
        return match identity {
            None => Ok(ClusterDial::plain()),
            Some(_) => Err(CtlError::Usage(
                "--tls-cert and --tls-key need --tls-ca (the CA the control plane's certificate is signed by)".into(),
            )),
        };
    };
    ClusterDial::tls(&ClientTlsFiles {
        ca: PemFile::new("--tls-ca", ca),
        identity,
    })
    .map_err(|e| CtlError::Usage(e.to_string()))
}

/// Prints a response as proto-JSON or through its table view.
fn emit<M: prost::Message + prost::Name>(
    out: &mut dyn Write,
    format: OutputFormat,
    message: &M,
    table: impl FnOnce(&M) -> String,
) -> Result<(), CtlError> {
    match format {
        OutputFormat::Json => {
            let json = nereid_proto::message_to_json(message);
            let text = serde_json::to_string_pretty(&json)
                .map_err(|e| CtlError::Output(format!("cannot print JSON: {e}")))?;
            writeln!(out, "{text}")?;
        }
        OutputFormat::Table => write!(out, "{}", table(message))?,
    }
    Ok(())
}

/// The model's status once its replicas are ready, with `--wait`; `written` as it is without.
async fn waited(
    connection: &Connection,
    written: nereid_proto::pb::cluster::ModelStatus,
    wait: WaitArgs,
    consistency: i32,
) -> Result<nereid_proto::pb::cluster::ModelStatus, CtlError> {
    if !wait.wait {
        return Ok(written);
    }
    let name = written
        .model
        .as_ref()
        .map(|m| m.name.clone())
        .unwrap_or_default();
    wait::until_ready(
        connection,
        &name,
        consistency,
        std::time::Duration::from_secs(wait.timeout),
    )
    .await
}

/// Runs the command in `args` and writes its output to `out`.
pub async fn execute(args: &CtlArgs, out: &mut dyn Write) -> Result<(), CtlError> {
    let connection = Connection::new(args.control_plane.clone(), token(args)?)?
        .with_dial(dial(args)?, args.tls_cert.is_some());
    let consistency = request::consistency(args.consistency);
    let format = args.output;
    match &args.command {
        CtlCommand::Models(command) => match command {
            ModelsCommand::Deploy(deploy) => {
                let message = request::deploy_request(deploy).map_err(CtlError::Usage)?;
                let status = connection
                    .call(message, |mut c, r| async move { c.deploy_model(r).await })
                    .await?;
                let status = waited(&connection, status, deploy.wait, consistency).await?;
                emit(out, format, &status, render::model)
            }
            ModelsCommand::List => {
                let response = connection
                    .call(ListModelsRequest { consistency }, |mut c, r| async move {
                        c.list_models(r).await
                    })
                    .await?;
                emit(out, format, &response, render::model_list)
            }
            ModelsCommand::Get { name } => {
                let message = ModelRef {
                    name: name.clone(),
                    consistency,
                };
                let status = connection
                    .call(message, |mut c, r| async move { c.get_model(r).await })
                    .await?;
                emit(out, format, &status, render::model)
            }
            ModelsCommand::Scale(scale) => {
                let message = request::scale_request(scale).map_err(CtlError::Usage)?;
                let status = connection
                    .call(message, |mut c, r| async move { c.scale_model(r).await })
                    .await?;
                let status = waited(&connection, status, scale.wait, consistency).await?;
                emit(out, format, &status, render::model)
            }
            ModelsCommand::Traffic(traffic) => {
                let message = request::traffic_request(traffic).map_err(CtlError::Usage)?;
                let status = connection
                    .call(message, |mut c, r| async move { c.set_traffic(r).await })
                    .await?;
                emit(out, format, &status, render::model)
            }
            ModelsCommand::Autoscale(autoscale) => {
                let status = autoscale::set(&connection, autoscale, consistency).await?;
                emit(out, format, &status, autoscale::render)
            }
            ModelsCommand::Delete { name } => {
                let message = ModelRef {
                    name: name.clone(),
                    consistency,
                };
                let response = connection
                    .call(message, |mut c, r| async move { c.delete_model(r).await })
                    .await?;
                emit(out, format, &response, |r| {
                    format!("model {name} deleted (revision {})\n", r.revision)
                })
            }
            ModelsCommand::Placement { name } => {
                let message = ModelRef {
                    name: name.clone(),
                    consistency,
                };
                let explanation = connection
                    .call(
                        message,
                        |mut c, r| async move { c.explain_placement(r).await },
                    )
                    .await?;
                emit(out, format, &explanation, render::placement)
            }
        },
        CtlCommand::Nodes(command) => {
            let node_ref = |id: &String| NodeRef {
                id: id.clone(),
                consistency,
            };
            let status = match command {
                NodesCommand::List => {
                    let response = connection
                        .call(ListNodesRequest { consistency }, |mut c, r| async move {
                            c.list_nodes(r).await
                        })
                        .await?;
                    return emit(out, format, &response, render::node_list);
                }
                NodesCommand::Get { id } => {
                    connection
                        .call(node_ref(id), |mut c, r| async move { c.get_node(r).await })
                        .await?
                }
                NodesCommand::Drain { id } => {
                    connection
                        .call(
                            node_ref(id),
                            |mut c, r| async move { c.drain_node(r).await },
                        )
                        .await?
                }
                NodesCommand::Undrain { id } => {
                    connection
                        .call(
                            node_ref(id),
                            |mut c, r| async move { c.undrain_node(r).await },
                        )
                        .await?
                }
            };
            emit(out, format, &status, render::node)
        }
        CtlCommand::Placements => {
            let response = connection
                .call(
                    ListPlacementsRequest { consistency },
                    |mut c, r| async move { c.list_placements(r).await },
                )
                .await?;
            emit(out, format, &response, render::placements)
        }
        CtlCommand::Cluster(command) => {
            let status = match command {
                ClusterCommand::Status => {
                    connection
                        .call(ClusterStatusRequest {}, |mut c, r| async move {
                            c.get_cluster_status(r).await
                        })
                        .await?
                }
                ClusterCommand::AddMember { id, address } => {
                    let message = AddMemberRequest {
                        id: *id,
                        address: address.clone(),
                    };
                    connection
                        .call(message, |mut c, r| async move { c.add_member(r).await })
                        .await?
                }
                ClusterCommand::RemoveMember { id } => {
                    connection
                        .call(RemoveMemberRequest { id: *id }, |mut c, r| async move {
                            c.remove_member(r).await
                        })
                        .await?
                }
            };
            emit(out, format, &status, render::cluster)
        }
    }
}
