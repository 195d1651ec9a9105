enable f16;@group(0)
@binding(0)
var<storage, read_write> buffer_0_global: array<vec4<f16>>;

@group(0)
@binding(1)
var<storage, read_write> buffer_1_global: array<vec4<f32>>;

struct info_st {
   scalars_u32: array<u32, 4>,
   static_meta: array<u32, 4>,
}

@group(0)
@binding(2)
var<storage, read> info: info_st;

var<workgroup> shared_memory_5: array<vec4<f32>, 128>;

const WORKGROUP_SIZE_X = 128u;
const WORKGROUP_SIZE_Y = 1u;
const WORKGROUP_SIZE_Z = 1u;

@compute
@workgroup_size(128, 1, 1)
fn k_channel_mean_e__n_4(
    @builtin(local_invocation_index) local_idx: u32,
    @builtin(num_workgroups) num_workgroups: vec3<u32>,
    @builtin(workgroup_id) workgroup_id: vec3<u32>,
) {
var l_mut_47: vec4<bool>;
var l_mut_8: vec4<f32>;
let l_0 = local_idx % u32(16);
let l_1 = local_idx / u32(16);
let l_2 = workgroup_id.y * info.scalars_u32[1];
let l_3 = workgroup_id.x * info.scalars_u32[2];
let l_4 = l_2 + l_3;
let l_6 = l_1 < u32(8);
if l_6 {
let l_7 = vec4<f32>(f32(0.0));
l_mut_8 = l_7;
let l_9 = info.scalars_u32[0] + u32(8);
let l_10 = l_9 - u32(1);
let l_11 = l_10 - l_1;
let l_12 = l_11 / u32(8);

for (var l_mut_13: u32 = u32(0); l_mut_13 < l_12; l_mut_13++) {
let l_14 = l_mut_13 * u32(8);
let l_15 = l_1 + l_14;
let l_16 = l_15 * info.scalars_u32[3];
let l_17 = l_4 + l_16;
let l_18 = l_17 / u32(4);
let l_19 = l_18 + l_0;
let l_20 = buffer_0_global[l_19];
let l_21 = vec4<f32>(l_20);
l_mut_8 = l_mut_8 + l_21;
}
let l_22 = l_1 * u32(16);
let l_23 = l_22 + l_0;
shared_memory_5[l_23] = l_mut_8;
}
workgroupBarrier();
let l_24 = l_1 == u32(0);
if l_24 {
let l_25 = shared_memory_5[l_0];
l_mut_8 = l_25;
let l_26 = u32(16) + l_0;
let l_27 = shared_memory_5[l_26];
l_mut_8 = l_mut_8 + l_27;
let l_28 = u32(32) + l_0;
let l_29 = shared_memory_5[l_28];
l_mut_8 = l_mut_8 + l_29;
let l_30 = u32(48) + l_0;
let l_31 = shared_memory_5[l_30];
l_mut_8 = l_mut_8 + l_31;
let l_32 = u32(64) + l_0;
let l_33 = shared_memory_5[l_32];
l_mut_8 = l_mut_8 + l_33;
let l_34 = u32(80) + l_0;
let l_35 = shared_memory_5[l_34];
l_mut_8 = l_mut_8 + l_35;
let l_36 = u32(96) + l_0;
let l_37 = shared_memory_5[l_36];
l_mut_8 = l_mut_8 + l_37;
let l_38 = u32(112) + l_0;
let l_39 = shared_memory_5[l_38];
l_mut_8 = l_mut_8 + l_39;
let l_40 = f32(info.scalars_u32[0]);
let l_41 = vec4<f32>(l_40);
let l_42 = workgroup_id.y * num_workgroups.x;
let l_43 = l_42 + workgroup_id.x;
let l_44 = l_43 * u32(16);
let l_45 = l_44 + l_0;
let l_46 = vec4<f32>(f32(0.0));
l_mut_47 = l_41 > l_46;
let l_48 = l_mut_8 / l_41;
let l_49 = vec4<f32>(f32(0.0));
let l_50 = select(l_49, l_48, l_mut_47);
buffer_1_global[l_45] = l_50;
}
}
