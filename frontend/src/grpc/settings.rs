//! gRPC `TraceSetting` and `LogSettings`: protobuf maps ↔ `nereid_proto` settings maps.
//!
//! A `TraceSetting` call with an empty `model_name` is the global setting; a key whose value
//! list is empty clears it (as tritonclient sends for `None`). A call with no settings only
//! reads. A `LogSettings` value without a `parameter_choice` is INVALID_ARGUMENT naming its key.

use nereid_proto::pb::inference::log_settings_request::setting_value::ParameterChoice as RequestChoice;
use nereid_proto::pb::inference::log_settings_response::setting_value::ParameterChoice as ResponseChoice;
use nereid_proto::pb::inference::{
    LogSettingsRequest, LogSettingsResponse, TraceSettingRequest, TraceSettingResponse,
    log_settings_response, trace_setting_response,
};
use nereid_proto::{
    LogSettings, LogValue, ServiceError, ServiceResult, TraceSettings, TraceSettingsUpdate,
};

/// The model the call names (`None`: global) and its update (`None`: read only).
pub(crate) fn trace_request(
    request: TraceSettingRequest,
) -> (Option<String>, Option<TraceSettingsUpdate>) {
    let model = (!request.model_name.is_empty()).then_some(request.model_name);
    let update = (!request.settings.is_empty()).then(|| {
        request
            .settings
            .into_iter()
            .map(|(key, value)| {
                let values = (!value.value.is_empty()).then_some(value.value);
                (key, values)
            })
            .collect()
    });
    (model, update)
}

pub(crate) fn trace_response(settings: TraceSettings) -> TraceSettingResponse {
    TraceSettingResponse {
        settings: settings
            .into_iter()
            .map(|(key, value)| (key, trace_setting_response::SettingValue { value }))
            .collect(),
    }
}

pub(crate) fn log_request(request: LogSettingsRequest) -> ServiceResult<Option<LogSettings>> {
    if request.settings.is_empty() {
        return Ok(None);
    }
    request
        .settings
        .into_iter()
        .map(|(key, value)| {
            let value = match value.parameter_choice {
                Some(RequestChoice::BoolParam(b)) => LogValue::Bool(b),
                Some(RequestChoice::Uint32Param(n)) => LogValue::Uint(n),
                Some(RequestChoice::StringParam(s)) => LogValue::Text(s),
                None => {
                    return Err(ServiceError::invalid(format!(
                        "log setting '{key}' has no value"
                    )));
                }
            };
            Ok((key, value))
        })
        .collect::<ServiceResult<LogSettings>>()
        .map(Some)
}

pub(crate) fn log_response(settings: LogSettings) -> LogSettingsResponse {
    LogSettingsResponse {
        settings: settings
            .into_iter()
            .map(|(key, value)| {
                let choice = match value {
                    LogValue::Bool(b) => ResponseChoice::BoolParam(b),
                    LogValue::Uint(n) => ResponseChoice::Uint32Param(n),
                    LogValue::Text(s) => ResponseChoice::StringParam(s),
                };
                let value = log_settings_response::SettingValue {
                    parameter_choice: Some(choice),
                };
                (key, value)
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nereid_proto::pb::inference::{log_settings_request, trace_setting_request};

    #[test]
    fn empty_values_clear_and_empty_calls_read() {
        let mut request = TraceSettingRequest {
            model_name: "m".into(),
            ..Default::default()
        };
        assert_eq!(trace_request(request.clone()), (Some("m".into()), None));
        request.settings.insert(
            "trace_rate".into(),
            trace_setting_request::SettingValue {
                value: vec!["2".into()],
            },
        );
        request
            .settings
            .insert("trace_count".into(), Default::default());
        let (_, update) = trace_request(request);
        let update = update.unwrap();
        assert_eq!(update["trace_rate"], Some(vec!["2".to_string()]));
        assert_eq!(update["trace_count"], None);
    }

    #[test]
    fn log_values_without_a_choice_are_refused() {
        let mut request = LogSettingsRequest::default();
        assert_eq!(log_request(request.clone()).unwrap(), None);
        request.settings.insert(
            "log_info".into(),
            log_settings_request::SettingValue {
                parameter_choice: Some(RequestChoice::BoolParam(false)),
            },
        );
        assert_eq!(
            log_request(request.clone()).unwrap().unwrap()["log_info"],
            LogValue::Bool(false)
        );
        request
            .settings
            .insert("log_error".into(), Default::default());
        let err = log_request(request).unwrap_err();
        assert!(err.to_string().contains("'log_error'"), "{err}");
    }
}
