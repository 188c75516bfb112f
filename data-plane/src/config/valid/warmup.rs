//! The typed `model_warmup` settings of a config. Only typed here: whether a sample fits the
//! model (batch size, inputs, dims, data files) is checked when the samples are built
//! (the `warmup` module, a layer up), whose messages become the load failure reason.

use std::collections::BTreeMap;

use nereid_proto::DataType;
use nereid_proto::pb::inference::ModelWarmup;
use nereid_proto::pb::inference::model_warmup::input::InputDataType;

/// One `model_warmup` entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmupSetting {
    /// The sample's name (`model_warmup.name`), which labels it in warmup logs and errors.
    pub name: String,
    /// 0: the sample is skipped.
    pub batch_size: u32,
    /// Times to run; 0 runs it once.
    pub count: u32,
    /// By input name.
    pub inputs: BTreeMap<String, WarmupInput>,
}

/// The data a warmup sample gives one input.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WarmupInput {
    /// `None`: unset (or a type this server does not know).
    pub datatype: Option<DataType>,
    /// Without the batch dimension.
    pub dims: Vec<i64>,
    /// `None`: the sample names no data source.
    pub data: Option<WarmupData>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
/// Where a warmup sample takes an input's values from.
pub enum WarmupData {
    /// `zero_data`: every byte zero.
    Zero,
    /// `random_data`: random values.
    Random,
    /// A file under the model directory's `warmup/` folder.
    File(String),
}

impl WarmupSetting {
    pub(super) fn from_wire(w: &ModelWarmup) -> WarmupSetting {
        WarmupSetting {
            name: w.name.clone(),
            batch_size: w.batch_size,
            count: w.count,
            inputs: w
                .inputs
                .iter()
                .map(|(name, i)| {
                    let input = WarmupInput {
                        datatype: DataType::from_config_i32(i.data_type),
                        dims: i.dims.clone(),
                        data: i.input_data_type.as_ref().map(|d| match d {
                            InputDataType::ZeroData(_) => WarmupData::Zero,
                            InputDataType::RandomData(_) => WarmupData::Random,
                            InputDataType::InputDataFile(f) => WarmupData::File(f.clone()),
                        }),
                    };
                    (name.clone(), input)
                })
                .collect(),
        }
    }
}
