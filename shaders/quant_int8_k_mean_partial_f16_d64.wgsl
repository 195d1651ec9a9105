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

var<workgroup> shared_memory_8: array<vec4<f32>, 128>;

const WORKGROUP_SIZE_X = 128u;
const WORKGROUP_SIZE_Y = 1u;
const WORKGROUP_SIZE_Z = 1u;

@compute
@workgroup_size(128, 1, 1)
fn k_mean_partial_e__n_4(
    @builtin(local_invocation_index) local_idx: u32,
    @builtin(num_workgroups) num_workgroups: vec3<u32>,
    @builtin(workgroup_id) workgroup_id: vec3<u32>,
) {
var l_mut_11: vec4<f32>;
let l_0 = local_idx % u32(16);
let l_1 = local_idx / u32(16);
let l_2 = workgroup_id.x * u32(256);
let l_3 = info.scalars_u32[0] - l_2;
let l_4 = min(l_3, u32(256));
let l_5 = workgroup_id.z * info.scalars_u32[1];
let l_6 = workgroup_id.y * info.scalars_u32[2];
let l_7 = l_5 + l_6;
let l_9 = l_1 < u32(8);
if l_9 {
let l_10 = vec4<f32>(f32(0.0));
l_mut_11 = l_10;
let l_12 = l_4 + u32(8);
let l_13 = l_12 - u32(1);
let l_14 = l_13 - l_1;
let l_15 = l_14 / u32(8);

for (var l_mut_16: u32 = u32(0); l_mut_16 < l_15; l_mut_16++) {
let l_17 = l_2 + l_1;
let l_18 = l_mut_16 * u32(8);
let l_19 = l_17 + l_18;
let l_20 = l_19 * info.scalars_u32[3];
let l_21 = l_7 + l_20;
let l_22 = l_21 / u32(4);
let l_23 = l_22 + l_0;
let l_24 = buffer_0_global[l_23];
let l_25 = vec4<f32>(l_24);
l_mut_11 = l_mut_11 + l_25;
}
let l_26 = l_1 * u32(16);
let l_27 = l_26 + l_0;
shared_memory_8[l_27] = l_mut_11;
}
workgroupBarrier();
let l_28 = l_1 == u32(0);
if l_28 {
let l_29 = shared_memory_8[l_0];
l_mut_11 = l_29;
let l_30 = u32(16) + l_0;
let l_31 = shared_memory_8[l_30];
l_mut_11 = l_mut_11 + l_31;
let l_32 = u32(32) + l_0;
let l_33 = shared_memory_8[l_32];
l_mut_11 = l_mut_11 + l_33;
let l_34 = u32(48) + l_0;
let l_35 = shared_memory_8[l_34];
l_mut_11 = l_mut_11 + l_35;
let l_36 = u32(64) + l_0;
let l_37 = shared_memory_8[l_36];
l_mut_11 = l_mut_11 + l_37;
let l_38 = u32(80) + l_0;
let l_39 = shared_memory_8[l_38];
l_mut_11 = l_mut_11 + l_39;
let l_40 = u32(96) + l_0;
let l_41 = shared_memory_8[l_40];
l_mut_11 = l_mut_11 + l_41;
let l_42 = u32(112) + l_0;
let l_43 = shared_memory_8[l_42];
l_mut_11 = l_mut_11 + l_43;
let l_44 = workgroup_id.z * num_workgroups.y;
let l_45 = l_44 + workgroup_id.y;
let l_46 = l_45 * num_workgroups.x;
let l_47 = l_46 + workgroup_id.x;
let l_48 = l_47 * u32(16);
let l_49 = l_48 + l_0;
buffer_1_global[l_49] = l_mut_11;
}
}
